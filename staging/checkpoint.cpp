// Gathering the full model state; see checkpoint.h and Note [Gathering the state].
#include "staging/checkpoint.h"

#include <map>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "staging/stage_runner.h"

namespace autostage::staging {

std::vector<std::pair<std::string, at::Tensor>> gatherState(
    const torchscript::ImportedModel& model, const core::Deployment& deployment,
    comm::Backend& backend) {
  at::NoGradGuard noGrad;
  std::map<core::ValueId, int> lowestHolder;
  for (const core::StageDeployment& stage : deployment.stages) {
    for (core::ValueId p : stageParams(model.graph, stage)) {
      for (int rank : stage.ranks) {
        auto [it, added] = lowestHolder.emplace(p, rank);
        if (!added && rank < it->second) it->second = rank;
      }
    }
  }
  const std::vector<core::ValueId> params = model.graph.paramInputs();
  AUTOSTAGE_INTERNAL_ASSERT(params.size() == model.paramTensors.size(),
                            "imported model has ", model.paramTensors.size(),
                            " parameter tensors for ", params.size(), " PARAM inputs");
  std::vector<std::pair<std::string, at::Tensor>> state;
  const comm::Group world = backend.world();
  for (size_t i = 0; i < params.size(); ++i) {
    auto found = lowestHolder.find(params[i]);
    const int source = found == lowestHolder.end() ? 0 : found->second;
    at::Tensor copy = model.paramTensors[i].detach().clone().contiguous();
    if (backend.worldSize() > 1) backend.broadcast(copy, source, world);
    state.emplace_back(model.paramNames[i], copy);
  }
  return state;
}

}  // namespace autostage::staging
