#pragma once
// Loading a state dict into a TorchScript module from C++ (autostage::Module::loadStateDict), with
// the checks and messages of the Python side (bindings/python/autostage/checkpoint.py): nothing is
// copied unless every key fits.

#include <string>

#include <torch/csrc/jit/api/module.h>

#include "staging/checkpoint.h"

namespace autostage::staging {

// "" when `state` fits `module`'s parameters and buffers (every key of both, same shapes; with
// `strict` false, missing and unexpected keys are skipped), else the FormatError message naming
// each problem (at most 8) and what to do.
std::string stateDictProblem(const torch::jit::Module& module, const NamedTensors& state,
                             bool strict);

// Copies `state` into `module`'s own parameter and buffer tensors (in place, so every deployment
// of them sees the values); throws FormatError with stateDictProblem's message, having copied
// nothing, when it does not fit.
void loadStateDict(torch::jit::Module& module, const NamedTensors& state, bool strict = true);

}  // namespace autostage::staging
