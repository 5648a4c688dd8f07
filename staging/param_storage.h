#pragma once
// The parameters and buffers this rank's stages read, keyed by IR value id and state_dict name.
//
// The tensors are the imported module's own persistent tensors (ImportedModel::paramTensors), not
// copies: optimisers update them in place and in-place buffer updates (BatchNorm running stats)
// persist in the user's module. Parameters no local stage reads are not held.
//
// Note [Tied parameters]
// A parameter read by several stages (e.g. tied embeddings) is held by every rank of each of those
// stages. Its gradient is summed over all of them (GradientSync groups each parameter by the set
// of ranks holding it), so every holder ends with the gradient of the whole model.

#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/backend.h"
#include "frontend/torchscript/importer.h"

namespace autostage::staging {

class ParamStorage {
 public:
  ParamStorage() = default;
  // Holds the entries of `model` whose value ids are in `localParams` (other ids throw).
  ParamStorage(const torchscript::ImportedModel& model,
               const std::vector<core::ValueId>& localParams);

  bool has(core::ValueId id) const { return index_.count(id) != 0; }
  // Throws InternalError for a parameter this rank does not hold.
  const at::Tensor& tensor(core::ValueId id) const;
  const std::string& name(core::ValueId id) const;
  // Held value ids, in graph input order.
  const std::vector<core::ValueId>& ids() const { return ids_; }
  // Held tensors that require grad (what an optimiser on this rank should update), in id order.
  std::vector<at::Tensor> parameters() const;
  // Held tensors that do not require grad (buffers such as BatchNorm running statistics).
  std::vector<at::Tensor> buffers() const;
  // Held tensors with their state_dict names.
  std::vector<std::pair<std::string, at::Tensor>> namedTensors() const;

  // Copies rank `root`'s values of every parameter and buffer of `model` into every rank's
  // tensors (a broadcast per tensor over the world, in graph input order), so all replicas start
  // identical. Collective over the world.
  static void synchronize(const torchscript::ImportedModel& model, comm::Backend& backend,
                          int root = 0);

 private:
  std::vector<core::ValueId> ids_;
  std::vector<at::Tensor> tensors_;
  std::vector<std::string> names_;
  std::unordered_map<core::ValueId, size_t> index_;
};

}  // namespace autostage::staging
