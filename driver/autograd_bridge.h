#pragma once
// The autograd bridge between a Module's forward and the pipeline backward, and how an error
// inside the pipeline reaches the caller (the rank and stage in front of it).
//
// Note [The autograd bridge]
// Module::forward returns its outputs through one autograd node (a torch::autograd::Function
// over a requires-grad anchor), so the caller's `loss.backward()` on each rank reaches the node,
// whose backward runs the pipeline backward (Executor::backward) with the caller's gradients.
// The node keeps the executor of that forward and the imported model it runs alive until the
// backward has run, even when the Module is destroyed first
// (`autostage.Module(m)(x).sum().backward()`); outputs go back to the caller's device and their
// gradients come back from it.

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "frontend/torchscript/importer.h"
#include "staging/executor.h"

namespace autostage::driver {

// `outputs` (on the stages' device) as the caller gets them: on callerDevice, behind the bridge's
// autograd node.
std::vector<at::Tensor> pipelineOutputs(const at::Tensor& anchor,
                                        std::shared_ptr<const torchscript::ImportedModel> model,
                                        std::shared_ptr<staging::Executor> executor, int rank,
                                        std::vector<at::Tensor> outputs,
                                        c10::Device callerDevice);

// The tensors on `device` (undefined ones stay undefined).
std::vector<at::Tensor> movedTo(const std::vector<at::Tensor>& tensors, c10::Device device);

// "rank 2, stage 1 (STAGE_3_5)" or "rank 2 (no stage)".
std::string whereOf(const staging::Executor& executor, int rank);

// Rethrows the exception being handled, same autostage class, with `where` in front (an error
// of the TorchScript interpreter by its last line, which names the op).
[[noreturn]] void rethrowAt(const std::string& where);

}  // namespace autostage::driver
