#pragma once
// Gathering the full model state from the ranks that hold it (checkpoints), handing it over to
// another deployment of the same model (train/eval), and gathering named tensors from the ranks
// that own them (optimizer state).
//
// Note [Gathering the state]
// Every rank imported the whole module, so every rank knows every parameter's and buffer's shape,
// dtype and state_dict key; only the holders of a tensor (the replicas of the stages that read
// it) have its current value. For each PARAM input of the graph, in graph order, the lowest rank
// holding it broadcasts its tensor to the world; a tensor no stage reads (never updated) comes
// from rank 0's module. Every rank therefore ends with the same full state, keyed like the
// original module's state_dict, loadable by the plain, unwrapped model. Collective over the world;
// it costs one model's worth of memory on every rank.
//
// Note [Gathering from owners]
// State that only its owners know the shape of (an optimizer's per-parameter state) is gathered
// by name: every rank passes the named tensors it owns (the replicas of a stage pass identical
// copies under the same name), the ranks exchange names, dtypes and shapes, and for each name, in
// sorted order, its lowest owner broadcasts the tensor to the world. Owners that disagree on a
// name's dtype or shape are an error on every rank.

#include <ATen/core/Tensor.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.h"
#include "core/deployment.h"
#include "decomposer/tensor_parallel_split.h"
#include "frontend/torchscript/importer.h"

namespace autostage::staging {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// How a deployment holds a parameter in tensor-parallel slices: the cut (ParamShard's dim and
// parts, without the importing graph's value id, so two imports compare), the degree, and
// its stage's ranks, replica groups of `degree` consecutive ranks whose member j holds slice j.
// Equal layouts put the same slice on every rank.
struct SliceLayout {
  int dim = 0, degree = 1;
  std::vector<decomposer::ShardPart> parts;
  std::vector<int> ranks;
  // A table tied across stages (Note [Tied tables across stages] in gradient_sync.h): the other
  // stages slicing it, as (degree, ranks); joined from the first's slices.
  std::vector<std::pair<int, std::vector<int>>> alsoSliced;
  bool operator==(const SliceLayout& o) const {
    return dim == o.dim && parts == o.parts && degree == o.degree && ranks == o.ranks &&
           alsoSliced == o.alsoSliced;
  }
  bool operator!=(const SliceLayout& o) const { return !(*this == o); }
};
using SliceLayouts = std::map<std::string, SliceLayout>;  // by state_dict name

// The parameters `deployment` holds in slices, by name (the same on every rank; an Executor
// keeps its deployment's: Executor::sliceLayouts).
SliceLayouts sliceLayouts(const torchscript::ImportedModel& model,
                          const core::Deployment& deployment);

// Copies of every graph parameter and buffer with its state_dict key, current on every rank;
// the parameters in tensor-parallel slices now (`slicedNow`: Note [Sharing sliced parameters])
// joined into whole tensors.
NamedTensors gatherState(const torchscript::ImportedModel& model,
                         const core::Deployment& deployment, comm::Backend& backend,
                         const SliceLayouts& slicedNow);

// Writes the current value of every graph parameter and buffer (from its lowest holder, Note
// [Gathering the state]) into every rank's own tensor, in place, so that another deployment of
// the same tensors (the model's other train/eval mode) starts from current values on any rank.
// `slicedNow`: the parameters in tensor-parallel slices now, joined into whole tensors on every
// rank (Note [Sharing sliced parameters] in checkpoint.cpp), except those named in `keep`, left
// as they are (Note [Keeping slices across a switch]). Collective over the world.
void shareState(const torchscript::ImportedModel& model, const core::Deployment& deployment,
                comm::Backend& backend, const SliceLayouts& slicedNow,
                const std::set<std::string>& keep = {});

// Every rank's owned tensors, one per name, on every rank, sorted by name (Note [Gathering from
// owners]), on the backend's tensorDevice(). Names must not contain tabs or newlines. Collective
// over the world, for the call `how` names (every rank must be in it: agreeOnHow).
NamedTensors gatherFromOwners(comm::Backend& backend, const NamedTensors& owned,
                              const std::string& how = "gathering tensors");

}  // namespace autostage::staging
