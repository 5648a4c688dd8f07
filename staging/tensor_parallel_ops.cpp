// The tensor-parallel operators; see staging/tensor_parallel_ops.h.
#include "staging/tensor_parallel_ops.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "core/error.h"

namespace autostage::staging {

struct GroupState {
  GroupState(std::shared_ptr<comm::Backend> b, comm::Group g, int m, uint64_t s)
      : backend(std::move(b)), group(std::move(g)), member(m), seed(s) {}
  std::shared_ptr<comm::Backend> backend;
  comm::Group group;
  int member;
  uint64_t seed;
  std::atomic<uint64_t> draws{0};
};

namespace {

std::mutex registryMutex;
std::map<int64_t, std::shared_ptr<GroupState>> registry;
int64_t nextHandle = 1;

std::shared_ptr<GroupState> registered(int64_t handle) {
  std::lock_guard<std::mutex> lock(registryMutex);
  auto it = registry.find(handle);
  AUTOSTAGE_INTERNAL_ASSERT(it != registry.end(), "tensor-parallel group ", handle,
                            " is not registered on this rank");
  return it->second;
}

// Sums `t` (a fresh contiguous tensor) over the group in place.
void allReduceSum(at::Tensor& t, int64_t handle) {
  const std::shared_ptr<GroupState> g = registered(handle);
  g->backend->allReduce(t, comm::ReduceOp::Sum, g->group);
}

// SplitMix64's finalizer: well-spread 64-bit values from consecutive inputs.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A Bernoulli(keep) tensor shaped as `x`, drawn with a generator seeded with `seed`.
at::Tensor bernoulliLike(const at::Tensor& x, double keep, uint64_t seed) {
  at::Tensor noise = at::empty_like(x, at::MemoryFormat::Contiguous);
  if (x.device().is_cpu()) {
    at::Generator generator = at::detail::createCPUGenerator(seed);
    return noise.bernoulli_(keep, generator);
  }
  at::Generator generator = at::globalContext().defaultGenerator(x.device());
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved = generator.get_state();
    generator.set_current_seed(seed);
  }
  try {
    noise.bernoulli_(keep, generator);
  } catch (...) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved);
    throw;
  }
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(saved);
  return noise;
}

at::Tensor summed(const at::Tensor& t, int64_t handle) {
  at::Tensor out = t.contiguous().clone();
  allReduceSum(out, handle);
  return out;
}

class CopyToGroup : public torch::autograd::Function<CopyToGroup> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t handle) {
    ctx->saved_data["handle"] = handle;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t handle = ctx->saved_data["handle"].toInt();
    return {grads[0].defined() ? summed(grads[0], handle) : grads[0], at::Tensor()};
  }
};

class ReduceFromGroup : public torch::autograd::Function<ReduceFromGroup> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x,
                            int64_t handle) {
    return summed(x, handle);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

at::Tensor tpCopy(const at::Tensor& x, int64_t group) { return CopyToGroup::apply(x, group); }

// Megatron's vocabulary-parallel embedding: this member holds rows [m rows, (m + 1) rows) of the
// table; ids outside them read zeros, and the all-reduce sums each id's one row.
at::Tensor tpEmbedding(const at::Tensor& weight, const at::Tensor& indices, int64_t padding,
                       int64_t group) {
  const int64_t rows = weight.size(0);
  const int64_t start = registered(group)->member * rows;
  const at::Tensor local = indices - start;
  const at::Tensor inside = local.ge(0).logical_and(local.lt(rows));
  const int64_t localPadding = padding >= start && padding < start + rows ? padding - start : -1;
  at::Tensor out = at::embedding(weight, local.masked_fill(inside.logical_not(), 0), localPadding);
  out = out * inside.unsqueeze(-1).to(out.scalar_type());
  return ReduceFromGroup::apply(out, group);
}

// Note [Tensor-parallel dropout]; scaled as torch's dropout: kept elements divided by 1 - p.
at::Tensor tpDropout(const at::Tensor& x, double p, bool train, int64_t split, int64_t group) {
  AUTOSTAGE_CHECK_AS(ConfigError, p >= 0 && p <= 1, "dropout probability ", p,
                     " is not between 0 and 1");
  if (!train || p == 0) return x;
  if (p == 1) return x * at::zeros_like(x);
  const std::shared_ptr<GroupState> g = registered(group);
  uint64_t seed = mix(g->seed ^ mix(g->draws.fetch_add(1)));
  if (split != 0) seed = mix(seed ^ (static_cast<uint64_t>(g->member) + 1));
  at::Tensor noise;
  {
    at::NoGradGuard noGrad;
    noise = bernoulliLike(x, 1 - p, seed).div_(1 - p);
  }
  return x * noise;
}

at::Tensor tpReduce(const at::Tensor& x, const c10::optional<at::Tensor>& bias, int64_t group) {
  at::Tensor y = ReduceFromGroup::apply(x, group);
  return bias.has_value() && bias->defined() ? y + *bias : y;
}

}  // namespace

TORCH_LIBRARY(autostage, m) {
  m.def("tp_copy(Tensor x, int group) -> Tensor");
  m.def("tp_reduce(Tensor x, Tensor? bias, int group) -> Tensor");
  m.def("tp_dropout(Tensor x, float p, bool train, int split, int group) -> Tensor");
  m.def("tp_embedding(Tensor weight, Tensor indices, int padding_idx, int group) -> Tensor");
}

TORCH_LIBRARY_IMPL(autostage, CompositeImplicitAutograd, m) {
  m.impl("tp_copy", tpCopy);
  m.impl("tp_reduce", tpReduce);
  m.impl("tp_dropout", tpDropout);
  m.impl("tp_embedding", tpEmbedding);
}

TensorParallelGroup::TensorParallelGroup(std::shared_ptr<comm::Backend> backend, comm::Group group,
                                         int member) {
  // The first member's seed, as text over the control plane (Note [Tensor-parallel dropout]).
  std::string seed = std::to_string(at::detail::getDefaultCPUGenerator().current_seed());
  backend->broadcastBytes(seed, group.ranks().front(), group);
  state_ = std::make_shared<GroupState>(std::move(backend), std::move(group), member,
                                        std::stoull(seed));
  std::lock_guard<std::mutex> lock(registryMutex);
  handle_ = nextHandle++;
  registry.emplace(handle_, state_);
}

TensorParallelGroup::~TensorParallelGroup() {
  std::lock_guard<std::mutex> lock(registryMutex);
  registry.erase(handle_);
}

uint64_t TensorParallelGroup::seed() const { return state_->seed; }
uint64_t TensorParallelGroup::draws() const { return state_->draws.load(); }
void TensorParallelGroup::setDraws(uint64_t draws) { state_->draws.store(draws); }

at::Tensor shardTensor(const at::Tensor& full, const ParamShard& shard, int degree, int index) {
  const int64_t size = full.size(shard.dim);
  AUTOSTAGE_CHECK_AS(ConfigError, size % (int64_t{shard.sections} * degree) == 0,
                     "a dimension of ", size, " cannot be split in ", shard.sections, " x ", degree,
                     " equal slices");
  const int64_t part = size / shard.sections, slice = part / degree;
  std::vector<at::Tensor> pieces;
  for (int s = 0; s < shard.sections; ++s)
    pieces.push_back(full.narrow(shard.dim, s * part + index * slice, slice));
  return at::cat(pieces, shard.dim).contiguous();
}

at::Tensor unshardTensor(const std::vector<at::Tensor>& slices, const ParamShard& shard) {
  AUTOSTAGE_INTERNAL_ASSERT(!slices.empty(), "no slices to join");
  const int64_t slice = slices.front().size(shard.dim) / shard.sections;
  std::vector<at::Tensor> pieces;
  for (int s = 0; s < shard.sections; ++s)
    for (const at::Tensor& t : slices) pieces.push_back(t.narrow(shard.dim, s * slice, slice));
  return at::cat(pieces, shard.dim);
}

}  // namespace autostage::staging
