// Gathering and handing over state; see checkpoint.h, Note [Gathering the state] and Note
// [Gathering from owners].
#include "staging/checkpoint.h"

#include <map>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "core/log.h"
#include "staging/call_inputs.h"
#include "staging/stage_runner.h"
#include "staging/tensor_parallel.h"
#include "staging/tensor_parallel_ops.h"

namespace autostage::staging {
namespace {

// Per PARAM input of the graph (in graph order): the lowest rank holding it, or 0 when no stage
// reads it.
std::vector<int> stateSources(const torchscript::ImportedModel& model,
                              const core::Deployment& deployment) {
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
  std::vector<int> sources;
  for (core::ValueId p : params) {
    auto found = lowestHolder.find(p);
    sources.push_back(found == lowestHolder.end() ? 0 : found->second);
  }
  return sources;
}

// What an owner announces about one tensor: dtype and shape.
struct TensorMeta {
  int dtype = 0;
  std::vector<int64_t> shape;
  int owner = -1;  // lowest rank announcing it
  bool operator==(const TensorMeta& o) const { return dtype == o.dtype && shape == o.shape; }
};

// One line per tensor: "name\tdtype\tdim0 dim1 ...".
std::string describeOwned(const NamedTensors& owned) {
  std::ostringstream out;
  for (const auto& [name, tensor] : owned) {
    AUTOSTAGE_CHECK(name.find_first_of("\t\n") == std::string::npos, "tensor name '", name,
                    "' contains a tab or newline; gathering by name needs names without them");
    out << name << '\t' << static_cast<int>(tensor.scalar_type()) << '\t';
    for (int64_t d = 0; d < tensor.dim(); ++d) out << (d ? " " : "") << tensor.size(d);
    out << '\n';
  }
  return out.str();
}

std::map<std::string, TensorMeta> collectOwners(const std::vector<std::string>& descriptions) {
  std::map<std::string, TensorMeta> metas;
  for (size_t rank = 0; rank < descriptions.size(); ++rank) {
    std::istringstream lines(descriptions[rank]);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream fields(line);
      std::string name, dtype, shape;
      std::getline(fields, name, '\t');
      std::getline(fields, dtype, '\t');
      std::getline(fields, shape);
      TensorMeta meta;
      meta.dtype = std::stoi(dtype);
      std::istringstream dims(shape);
      for (int64_t d; dims >> d;) meta.shape.push_back(d);
      meta.owner = static_cast<int>(rank);
      auto [it, added] = metas.emplace(name, meta);
      AUTOSTAGE_CHECK(added || it->second == meta, "'", name, "' has a different dtype or shape "
                      "on rank ", rank, " than on rank ", it->second.owner, "; the replicas of a "
                      "stage must hold identical state");
    }
  }
  return metas;
}

// The whole tensor of a sliced parameter on every rank, from the slices its first group holds
// (Note [Tensor-parallel parameters] in executor.cpp: member j broadcasts its slice j; every rank
// joins them). `own` is this rank's tensor (a slice on the group's members).
at::Tensor joinSlices(const at::Tensor& own, const SliceLayout& layout,
                      const std::vector<int64_t>& whole, comm::Backend& backend) {
  ParamShard shard;
  shard.dim = layout.dim;
  shard.parts = layout.parts;
  std::vector<int64_t> sliceShape = whole;
  sliceShape[shard.dim] = decomposer::memberExtent(layout.parts, layout.degree);
  const int self = backend.rank();
  std::vector<at::Tensor> slices;
  for (int j = 0; j < layout.degree; ++j) {
    const int member = layout.ranks.at(j);
    at::Tensor piece =
        self == member ? own.detach().clone().contiguous() : at::empty(sliceShape, own.options());
    backend.broadcast(piece, member, backend.world());
    slices.push_back(piece);
  }
  return unshardTensor(slices, shard, whole.at(shard.dim));
}

}  // namespace

NamedTensors gatherState(const torchscript::ImportedModel& model,
                         const core::Deployment& deployment, comm::Backend& backend,
                         const SliceLayouts& slicedNow) {
  at::NoGradGuard noGrad;
  const std::vector<int> sources = stateSources(model, deployment);
  const std::vector<core::ValueId> params = model.graph.paramInputs();
  NamedTensors state;
  const comm::Group world = backend.world();
  for (size_t i = 0; i < sources.size(); ++i) {
    const at::Tensor& own = model.paramTensors[i];
    auto slice = slicedNow.find(model.paramNames[i]);
    if (slice == slicedNow.end()) {
      at::Tensor copy = own.detach().clone().contiguous();
      if (backend.worldSize() > 1) backend.broadcast(copy, sources[i], world);
      state.emplace_back(model.paramNames[i], copy);
      continue;
    }
    state.emplace_back(model.paramNames[i],
                       joinSlices(own, slice->second,
                                  model.graph.value(params[i]).type.shape(), backend));
  }
  return state;
}

SliceLayouts sliceLayouts(const torchscript::ImportedModel& model,
                          const core::Deployment& deployment) {
  SliceLayouts out;
  const std::vector<core::ValueId> params = model.graph.paramInputs();
  std::map<core::ValueId, std::string> names;
  for (size_t i = 0; i < params.size(); ++i) names[params[i]] = model.paramNames.at(i);
  for (const core::StageDeployment& stage : deployment.stages) {
    if (stage.tensorParallel <= 1) continue;
    for (const ParamShard& shard :
         shardedParameters(model.graph, stage.nodes, stage.tensorParallel)) {
      const std::vector<int64_t>& shape = model.graph.value(shard.param).type.shape();
      auto [it, added] = out.emplace(names.at(shard.param),
                                     SliceLayout{shard.dim,
                                                 stage.tensorParallel,
                                                 decomposer::partsOf(shard, shape.at(shard.dim)),
                                                 stage.ranks,
                                                 {}});
      if (!added) it->second.alsoSliced.emplace_back(stage.tensorParallel, stage.ranks);
    }
  }
  return out;
}

// Note [Sharing sliced parameters]
// A deployment with tensor-parallel stages holds some parameters as slices (the model's own
// tensors take the slice as their data). Another deployment of the same tensors (the other
// train/eval mode, another usage, a replan) expects whole tensors, so sharing joins the first
// group's slices into the whole value and gives it to every rank's tensor (set_data); the
// deployment cuts its slices again when it is the current one once more
// (Executor::sliceHeldParameters). Which parameters are slices now is the module's to say
// (`slicedNow`, the same on every rank): every rank runs the same calls and switches, where
// only the group's members could tell it from their tensors' shapes. A slice's gradient is
// dropped with it: as on any switch, gradients accumulated across it without zero_grad()
// survive only where a parameter keeps its holders and its shape. Every rank holds every whole
// parameter meanwhile, as it does before the first deployment.
//
// Note [Keeping slices across a switch]
// Where the next deployment is known (one used before) and holds a parameter in the same slices
// on the same ranks (SliceLayout equal), the parameter is not joined: every rank keeps what it
// has (its slice on the members; on the other ranks a whole tensor that neither deployment
// reads) and the next deployment takes it (Executor::sliceHeldParameters): a training one copies
// it into its own storage, which the optimizer's parameters and ZeRO-1's pieces refer to, an
// inference one uses its storage as it is. Switching between train and eval modes of a model
// sharded alike in both moves no parameter bytes between ranks and never makes them whole on a
// member, and the slices' gradients stay (an eval forward between backward and step).
void shareState(const torchscript::ImportedModel& model, const core::Deployment& deployment,
                comm::Backend& backend, const SliceLayouts& slicedNow,
                const std::set<std::string>& keep) {
  if (backend.worldSize() == 1) return;
  at::NoGradGuard noGrad;
  const std::vector<int> sources = stateSources(model, deployment);
  const std::vector<core::ValueId> params = model.graph.paramInputs();
  const comm::Group world = backend.world();
  int joined = 0, kept = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const at::Tensor& t = model.paramTensors[i];
    const std::string& name = model.paramNames[i];
    if (keep.count(name)) {  // Note [Keeping slices across a switch]
      ++kept;
      continue;
    }
    auto slice = slicedNow.find(name);
    if (slice != slicedNow.end()) {  // Note [Sharing sliced parameters]
      replaceParamData(
          t, joinSlices(t, slice->second, model.graph.value(params[i]).type.shape(), backend));
      ++joined;
      continue;
    }
    AUTOSTAGE_CHECK_AS(UnsupportedError, t.is_contiguous(), "parameter '", model.paramNames[i],
                       "' is not contiguous; make it contiguous before wrapping the module");
    backend.broadcast(t.detach(), sources[i], world);
  }
  core::logger("Module")->debug(
      "shared {} tensors from their holders ({} joined from "
      "tensor-parallel slices)",
      sources.size() - kept, joined);
  if (kept > 0)
    core::logger("Module")->info(
        "{} tensor-parallel slices kept: the next deployment holds them "
        "alike (Note [Keeping slices across a switch])",
        kept);
}

NamedTensors gatherFromOwners(comm::Backend& backend, const NamedTensors& owned,
                              const std::string& how) {
  at::NoGradGuard noGrad;
  comm::StepStatus problem;
  std::string description;
  try {
    description = describeOwned(owned);
  } catch (...) {
    problem = comm::StepStatus::fromCurrentException();
  }
  const std::map<std::string, TensorMeta> metas =
      collectOwners(agreeOnHow(backend, how, problem, how, description));
  std::map<std::string, at::Tensor> mine(owned.begin(), owned.end());
  NamedTensors gathered;
  for (const auto& [name, meta] : metas) {
    at::Tensor t;
    // On the backend's device, where every rank can receive (the owner's may be a GPU).
    if (meta.owner == backend.rank()) {
      t = mine.at(name).detach().to(at::TensorOptions().device(backend.tensorDevice()),
                                    /*non_blocking=*/false, /*copy=*/true).contiguous();
    } else {
      t = at::empty(meta.shape, at::dtype(static_cast<at::ScalarType>(meta.dtype))
                                    .device(backend.tensorDevice()));
    }
    if (backend.worldSize() > 1) backend.broadcast(t, meta.owner, backend.world());
    gathered.emplace_back(name, t);
  }
  return gathered;
}

}  // namespace autostage::staging
