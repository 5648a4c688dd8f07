// The tensor-parallel operators; see staging/tensor_parallel_ops.h.
#include "staging/tensor_parallel_ops.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

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

// Note [Whole K/V heads]: this member's slice of every block of `block` indices along `dim`
// (the heads of Q it holds, of K and V repeated to every head): block / degree indices; where
// the members outnumber a block's indices (K and V heads read by grouped sdpa: Note [Grouped
// sdpa] in decomposer/tensor_parallel_split.cpp), the one index member * block / degree. Composed
// of differentiable operators: the backward puts the gradient back in the member's slice, zeros
// elsewhere.
at::Tensor tpSlice(const at::Tensor& x, int64_t dim, int64_t block, int64_t degree, int64_t group) {
  AUTOSTAGE_INTERNAL_ASSERT(
      dim >= 0 && dim < x.dim() && block > 0 && degree > 0 && x.size(dim) % block == 0 &&
          (block % degree == 0 || degree % block == 0),
      "tp_slice of ", x.sizes(), " along ", dim, " in blocks of ", block, " over ", degree);
  std::vector<int64_t> blocks = x.sizes().vec();
  blocks[dim] = x.size(dim) / block;
  blocks.insert(blocks.begin() + dim + 1, block);
  const int64_t member = registered(group)->member;
  const bool divides = block % degree == 0;
  const int64_t part = divides ? block / degree : 1;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[dim] = blocks[dim] * part;
  return x.reshape(blocks)
      .narrow(dim + 1, divides ? member * part : member * block / degree, part)
      .reshape(sizes);
}

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

// Note [Vocabulary-parallel loss]: the log-sum-exp along `dim` of logits split there over the
// group, kept dimension. Each member's own over its classes is gathered through one all-reduce
// (member m fills row m of a zero tensor) and combined stably; backward, each member's row goes
// back to its own classes.
at::Tensor wholeLogSumExp(const at::Tensor& x, int64_t dim, int64_t group) {
  const std::shared_ptr<GroupState> g = registered(group);
  const at::Tensor local = at::logsumexp(x, {dim}, /*keepdim=*/true);
  std::vector<at::Tensor> rows;
  for (size_t m = 0; m < g->group.ranks().size(); ++m)
    rows.push_back(static_cast<int>(m) == g->member ? local : at::zeros_like(local));
  return at::logsumexp(ReduceFromGroup::apply(at::stack(rows), group), {0});
}

// Log-softmax of split logits: the whole log-sum-exp enters the member's slice through tp_copy,
// which sums its gradient over the members' slices before it goes back to each row.
at::Tensor tpLogSoftmax(const at::Tensor& x, int64_t dim, int64_t group) {
  return x - CopyToGroup::apply(wholeLogSumExp(x, dim, group), group);
}

// Where each row's target class is in this member's slice of dimension 1 (`classes` wide): the
// index to gather (0 where the class is another member's) and whether it is here.
std::pair<at::Tensor, at::Tensor> localTargets(const at::Tensor& target, int64_t classes,
                                               int64_t group) {
  const at::Tensor local = target - registered(group)->member * classes;
  const at::Tensor inside = local.ge(0).logical_and(local.lt(classes));
  return {local.masked_fill(inside.logical_not(), 0).unsqueeze(1), inside};
}

// Per-row losses (zero where ignored) reduced as at::Reduction says: none, mean over the rows
// not ignored, or sum.
at::Tensor reduceLosses(const at::Tensor& losses, const at::Tensor& counted, int64_t reduction) {
  AUTOSTAGE_CHECK_AS(ConfigError, reduction >= 0 && reduction <= 2, "loss reduction ", reduction,
                     " is not none (0), mean (1) or sum (2)");
  if (reduction == 0) return losses;
  if (reduction == 2) return losses.sum();
  return losses.sum() / counted.sum().to(losses.scalar_type());
}

// nll_loss of log-probabilities split along dimension 1: the member holding a row's target
// picks it, the others read zero, and the all-reduce sums the one pick.
at::Tensor tpNllLoss(const at::Tensor& x, const at::Tensor& target, int64_t reduction,
                     int64_t ignoreIndex, int64_t group) {
  const auto [index, inside] = localTargets(target, x.size(1), group);
  const at::Tensor picked = x.gather(1, index).squeeze(1) * inside.to(x.scalar_type());
  const at::Tensor counted = target.ne(ignoreIndex);
  const at::Tensor losses = -ReduceFromGroup::apply(picked, group) * counted.to(x.scalar_type());
  return reduceLosses(losses, counted, reduction);
}

// torch's cross entropy with class indices and no class weights, label smoothing e included, of
// logits split along dimension 1, as Megatron-LM's parallel cross entropy: per row
// (1 - e) (lse - x_target) + e (lse - sum(x) / classes), the whole log-sum-exp, target logit
// and logit sum from one all-reduce each; its gradient is computed here, on the member's slice
// alone: (softmax - (1 - e) one-hot - e / classes) times the row's gradient. Saves the logits
// and the log-sum-exp (plain PyTorch saves the log-probabilities: as much).
class VocabularyCrossEntropy : public torch::autograd::Function<VocabularyCrossEntropy> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& target, int64_t reduction, int64_t ignoreIndex,
                            double smoothing, int64_t handle) {
    const int64_t classes =
        x.size(1) * static_cast<int64_t>(registered(handle)->group.ranks().size());
    const at::Tensor lse = wholeLogSumExp(x, 1, handle);
    const auto [index, inside] = localTargets(target, x.size(1), handle);
    const at::Tensor picked = x.gather(1, index).squeeze(1) * inside.to(x.scalar_type());
    const at::Tensor sums =
        summed(smoothing > 0 ? at::stack({picked, x.sum(1)}) : picked.unsqueeze(0), handle);
    const at::Tensor rowLse = lse.squeeze(1);
    at::Tensor losses = rowLse - sums[0];
    if (smoothing > 0)
      losses =
          losses * (1 - smoothing) + (rowLse - sums[1] / static_cast<double>(classes)) * smoothing;
    const at::Tensor counted = target.ne(ignoreIndex);
    losses = losses * counted.to(losses.scalar_type());
    ctx->save_for_backward({x, lse, index, inside, counted});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["smoothing"] = smoothing;
    ctx->saved_data["classes"] = classes;
    return reduceLosses(losses, counted, reduction);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return torch::autograd::variable_list(6);
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &lse = saved[1], &index = saved[2], &inside = saved[3],
                     &counted = saved[4];
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    const double smoothing = ctx->saved_data["smoothing"].toDouble();
    const int64_t classes = ctx->saved_data["classes"].toInt();
    // Each row's gradient: the output's (none), or its one value (sum) / over the rows counted.
    const at::Tensor outGrad =
        reduction == 1 ? grads[0] / counted.sum().to(x.scalar_type()) : grads[0];
    const at::Tensor rowGrad = counted.to(x.scalar_type()) * outGrad;
    at::Tensor grad = (x - lse).exp_();  // the softmax over all classes, on this slice
    if (smoothing > 0) grad.sub_(smoothing / static_cast<double>(classes));
    grad.scatter_add_(1, index, inside.unsqueeze(1).to(x.scalar_type()) * -(1 - smoothing));
    grad.mul_(rowGrad.unsqueeze(1));
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor tpCrossEntropy(const at::Tensor& x, const at::Tensor& target, int64_t reduction,
                          int64_t ignoreIndex, double smoothing, int64_t group) {
  return VocabularyCrossEntropy::apply(x, target, reduction, ignoreIndex, smoothing, group);
}

}  // namespace

TORCH_LIBRARY(autostage, m) {
  m.def("tp_copy(Tensor x, int group) -> Tensor");
  m.def("tp_slice(Tensor x, int dim, int block, int degree, int group) -> Tensor");
  m.def("tp_reduce(Tensor x, Tensor? bias, int group) -> Tensor");
  m.def("tp_dropout(Tensor x, float p, bool train, int split, int group) -> Tensor");
  m.def("tp_embedding(Tensor weight, Tensor indices, int padding_idx, int group) -> Tensor");
  m.def("tp_log_softmax(Tensor x, int dim, int group) -> Tensor");
  m.def(
      "tp_nll_loss(Tensor x, Tensor target, int reduction, int ignore_index, int group) -> Tensor");
  m.def(
      "tp_cross_entropy(Tensor x, Tensor target, int reduction, int ignore_index, "
      "float label_smoothing, int group) -> Tensor");
}

TORCH_LIBRARY_IMPL(autostage, CompositeImplicitAutograd, m) {
  m.impl("tp_copy", tpCopy);
  m.impl("tp_slice", tpSlice);
  m.impl("tp_reduce", tpReduce);
  m.impl("tp_dropout", tpDropout);
  m.impl("tp_embedding", tpEmbedding);
  m.impl("tp_log_softmax", tpLogSoftmax);
  m.impl("tp_nll_loss", tpNllLoss);
  m.impl("tp_cross_entropy", tpCrossEntropy);
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
uint64_t TensorParallelGroup::nextSeed() {
  // Tagged apart from tp_dropout's seeds of the same draw count.
  return mix(state_->seed ^ mix(state_->draws.fetch_add(1)) ^ 0x5eedULL);
}

at::Tensor shardTensor(const at::Tensor& full, const ParamShard& shard, int degree, int index) {
  const int64_t size = full.size(shard.dim);
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (const decomposer::ShardPart& part : decomposer::partsOf(shard, size)) {
    AUTOSTAGE_CHECK_AS(ConfigError, part.whole || part.size % degree == 0, "a part of ", part.size,
                       " of a dimension of ", size, " cannot be split in ", degree,
                       " equal slices");
    const int64_t slice = part.whole ? part.size : part.size / degree;
    pieces.push_back(full.narrow(shard.dim, offset + (part.whole ? 0 : index * slice), slice));
    offset += part.size;
  }
  AUTOSTAGE_CHECK_AS(ConfigError, offset == size, "parts of ", offset,
                     " indices for a dimension of ", size);
  return at::cat(pieces, shard.dim).contiguous();
}

at::Tensor unshardTensor(const std::vector<at::Tensor>& slices, const ParamShard& shard,
                         int64_t extent) {
  AUTOSTAGE_INTERNAL_ASSERT(!slices.empty(), "no slices to join");
  const int degree = static_cast<int>(slices.size());
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;  // in a member's slice
  for (const decomposer::ShardPart& part : decomposer::partsOf(shard, extent)) {
    const int64_t slice = part.whole ? part.size : part.size / degree;
    if (part.whole)
      pieces.push_back(slices.front().narrow(shard.dim, offset, slice));
    else
      for (const at::Tensor& t : slices) pieces.push_back(t.narrow(shard.dim, offset, slice));
    offset += slice;
  }
  return at::cat(pieces, shard.dim);
}

void replaceParamData(const at::Tensor& param, const at::Tensor& data) {
  at::Tensor p = param;
  p.set_data(data);
  if (p.grad().defined() && p.grad().sizes() != p.sizes()) p.mutable_grad() = at::Tensor();
}

}  // namespace autostage::staging
