#include "staging/param_storage.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "core/log.h"

namespace autostage::staging {

ParamStorage::ParamStorage(const torchscript::ImportedModel& model,
                           const std::vector<core::ValueId>& localParams) {
  std::vector<core::ValueId> all = model.graph.paramInputs();
  AUTOSTAGE_INTERNAL_ASSERT(all.size() == model.paramTensors.size(), "graph has ", all.size(),
                            " parameter inputs but the model ", model.paramTensors.size(),
                            " tensors");
  for (size_t i = 0; i < all.size(); ++i) {
    if (std::find(localParams.begin(), localParams.end(), all[i]) == localParams.end()) continue;
    index_[all[i]] = ids_.size();
    ids_.push_back(all[i]);
    tensors_.push_back(model.paramTensors[i]);
    names_.push_back(model.paramNames.at(i));
  }
  AUTOSTAGE_INTERNAL_ASSERT(ids_.size() == localParams.size(), "asked for ", localParams.size(),
                            " parameters, found ", ids_.size(), " among the graph's inputs");
}

const at::Tensor& ParamStorage::tensor(core::ValueId id) const {
  auto it = index_.find(id);
  AUTOSTAGE_INTERNAL_ASSERT(it != index_.end(), "parameter value ", id, " is not held here");
  return tensors_[it->second];
}

const std::string& ParamStorage::name(core::ValueId id) const {
  auto it = index_.find(id);
  AUTOSTAGE_INTERNAL_ASSERT(it != index_.end(), "parameter value ", id, " is not held here");
  return names_[it->second];
}

std::vector<at::Tensor> ParamStorage::parameters() const {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors_)
    if (t.requires_grad()) out.push_back(t);
  return out;
}

std::vector<at::Tensor> ParamStorage::buffers() const {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors_)
    if (!t.requires_grad()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ParamStorage::namedTensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < ids_.size(); ++i) out.emplace_back(names_[i], tensors_[i]);
  return out;
}

void ParamStorage::synchronize(const torchscript::ImportedModel& model, comm::Backend& backend,
                               int root) {
  if (backend.worldSize() == 1) return;
  at::NoGradGuard noGrad;
  comm::Group world = backend.world();
  for (size_t i = 0; i < model.paramTensors.size(); ++i) {
    const at::Tensor& t = model.paramTensors[i];
    AUTOSTAGE_CHECK_AS(UnsupportedError, t.is_contiguous(), "parameter '", model.paramNames[i],
                       "' is not contiguous; make it contiguous before wrapping the module");
    backend.broadcast(t.detach(), root, world);
  }
  core::logger("ParamStorage")
      ->debug("synchronized {} tensors from rank {}", model.paramTensors.size(), root);
}

}  // namespace autostage::staging
