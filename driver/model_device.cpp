#include "driver/model_device.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/api/module.h>

#include "core/error.h"

namespace autostage::driver {

namespace {
// What to do about a tensor on `found` when the stages run on `stage`.
std::string remedy(c10::Device found, c10::Device stage) {
  const std::string leave = "leave the model on the CPU when wrapping it (autostage moves it to " +
                            stage.str() + " itself)";
  if (found.is_cuda() && stage.is_cpu())
    return "move the model to the CPU (model.cpu()), or run the job on GPUs (device=cuda in a "
           "build with CUDA)";
  if (found.is_cuda() && stage.is_cuda())
    return leave + ", or put it on " + stage.str() + ": rank r uses cuda:(local rank mod GPU "
           "count), so the ranks do not share one GPU's model";
  return "materialize it on the CPU first; " + leave;
}
}  // namespace

std::string placementProblem(const std::string& name, c10::Device found, c10::Device stage) {
  if (found.is_cpu() || found == stage) return "";
  // A CUDA tensor without an index is on the current device: compare by type only.
  if (found.type() == stage.type() && (!found.has_index() || !stage.has_index())) return "";
  return "the model's tensor '" + name + "' is on " + found.str() + ", but this rank's stages " +
         "run on " + stage.str() + ": " + remedy(found, stage);
}

void placeTensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  c10::Device stage) {
  std::string first;
  int refused = 0;
  for (const auto& [name, t] : tensors) {
    std::string problem = t.defined() ? placementProblem(name, t.device(), stage) : "";
    if (problem.empty()) continue;
    if (refused++ == 0) first = problem;
  }
  AUTOSTAGE_CHECK_AS(ConfigError, refused == 0, first,
                     refused > 1 ? " (" + std::to_string(refused - 1) +
                                       " more tensor(s) of the model are on other devices too)"
                                 : std::string());
  if (stage.is_cpu()) return;
  at::NoGradGuard noGrad;
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || !t.device().is_cpu()) continue;
    at::Tensor tensor = t;  // a handle to the same TensorImpl: set_data moves the tensor itself
    if (tensor.grad().defined()) tensor.mutable_grad() = tensor.grad().to(stage);
    tensor.set_data(tensor.to(stage));
  }
}

std::vector<std::pair<std::string, at::Tensor>> stateTensorsOf(const torch::jit::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
  return out;
}

}  // namespace autostage::driver
