#pragma once
// Small TorchScript modules built in C++ (torch::jit::Module::define) and helpers that run an
// imported graph through exported subgraphs, for the torchscript tests.

#include <torch/script.h>

#include <map>
#include <string>
#include <vector>

#include "frontend/torchscript/exporter.h"
#include "frontend/torchscript/importer.h"

namespace autostage::torchscript::testing {

// fc1 -> relu -> fc2, each fc a submodule with `weight` and `bias` (in 8, hidden 16, out 3).
torch::jit::Module makeMlp();
// A scripted loop (prim::Loop) reading parameters inside its body, then a loss-like reduction.
torch::jit::Module makeLoopModel();
// Scripted control flow without outputs: nested loops and a branch clamp a value in place, and a
// branch only raises (Note [Effects of control flow as values], Note [Placeholder outputs]).
torch::jit::Module makeInPlaceLoopModel();
// forward returns a dict.
torch::jit::Module makeDictOutputModel();
// forward has a keyword-only argument.
torch::jit::Module makeKwargModel();

// Runs `parts` (each a node subset, in order) chained through a value environment seeded with
// the graph's batch inputs (`inputs`) and the model's parameter tensors; returns graph outputs.
std::vector<at::Tensor> runChained(const ImportedModel& model,
                                   const std::vector<c10::IValue>& inputs,
                                   const std::vector<std::vector<core::NodeId>>& parts);

std::vector<core::NodeId> nodeRange(core::NodeId begin, core::NodeId end);

// Gradients of all parameters of `model` after backward of sum(out_i^2), then zeroed again.
std::map<std::string, at::Tensor> gradientsOf(const ImportedModel& model,
                                              const std::vector<at::Tensor>& outputs);

}  // namespace autostage::torchscript::testing
