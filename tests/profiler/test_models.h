#pragma once
// Models for the profiler tests: MLPs built in C++ and traced Python models (transformer
// encoder, torchvision ResNets) produced once per machine by make_models.py.

#include <string>
#include <vector>

#include <torch/script.h>

namespace autostage::profiler::testing {

struct TestModel {
  torch::jit::Module module;
  std::vector<c10::IValue> inputs;
};

// `depth` linear+relu layers of `width` units on a (batch, width) input, then a sum.
TestModel makeMlp(int64_t width, int depth, int64_t batch);
// fc -> reshape(8, 16) -> fc: the reshape fails for any batch other than 8 (input width 16).
TestModel makeBatchEightOnlyModel();
// fc1 -> fc2 -> reshape(8, 16) -> fc3: fc3 is identical to fc2 (it reuses fc2's figures) and
// gets no input where the reshape fails (batch sizes other than 8).
TestModel makeFailureBeforeIdenticalModel();
// A traced model from make_models.py: "transformer", "resnet18", "bert24", "resnet50".
// Runs the build's Python (the one with its torch) once to create the files, in the build's own
// test_models/ folder.
TestModel loadTracedModel(const std::string& name);
// Directory loadTracedModel uses.
std::string tracedModelDir();

}  // namespace autostage::profiler::testing
