#pragma once
// Putting the model's tensors on the stages' device, once (Note [Placing the model]).

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace autostage::driver {

// Note [Placing the model]
// The stages compute with the model's own parameter and buffer tensors (the import lifts them
// to graph inputs and every deployment shares them), so they are put on the stages' device
// (the job's placement: Note [Device and transport] in placement.h) once, before the model is
// traced and profiled: a tensor on the CPU is moved there in place, as nn.Module.to moves it
// (set_data: the tensor object, and so the optimizer holding it, stays the same; its gradient
// moves too); one already there stays. A tensor on any other device (CUDA parameters for a CPU
// job, cuda:1 parameters on the rank placed at cuda:0, a meta tensor) is refused with a
// ConfigError naming the tensor, both devices and what to do, before anything moves. The Module
// agrees on the outcome over the ranks ("placing the model"), so every rank throws the error.
// The C++ Module places its jit::Module when it is made; autostage.Module (Python) places the
// wrapped nn.Module's tensors through Module::placeTensors before its first trace.

// What is wrong with the model's tensor `name` on `found` for stages on `stage`; "" when it can
// be placed (it is on the CPU or on `stage`). Pure.
std::string placementProblem(const std::string& name, c10::Device found, c10::Device stage);

// Checks every tensor, then moves those on the CPU to `stage` in place (with their gradients).
// Throws ConfigError for the first tensor that cannot be placed (naming how many could not),
// having moved nothing.
void placeTensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  c10::Device stage);

// The parameters and buffers of `module` and its submodules, with their state_dict names.
std::vector<std::pair<std::string, at::Tensor>> stateTensorsOf(const torch::jit::Module& module);

}  // namespace autostage::driver
