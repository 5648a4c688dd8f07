// The tensor-parallel operators; see staging/tensor_parallel_ops.h.
#include "staging/tensor_parallel_ops.h"

#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "core/error.h"

namespace autostage::staging {
namespace {

struct Registered {
  std::shared_ptr<comm::Backend> backend;
  comm::Group group;
};

std::mutex registryMutex;
std::map<int64_t, Registered> registry;
int64_t nextHandle = 1;

// Sums `t` (a fresh contiguous tensor) over the group in place.
void allReduceSum(at::Tensor& t, int64_t handle) {
  std::optional<Registered> r;
  {
    std::lock_guard<std::mutex> lock(registryMutex);
    auto it = registry.find(handle);
    AUTOSTAGE_INTERNAL_ASSERT(it != registry.end(), "tensor-parallel group ", handle,
                              " is not registered on this rank");
    r = it->second;
  }
  r->backend->allReduce(t, comm::ReduceOp::Sum, r->group);
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

at::Tensor tpReduce(const at::Tensor& x, const c10::optional<at::Tensor>& bias, int64_t group) {
  at::Tensor y = ReduceFromGroup::apply(x, group);
  return bias.has_value() && bias->defined() ? y + *bias : y;
}

}  // namespace

TORCH_LIBRARY(autostage, m) {
  m.def("tp_copy(Tensor x, int group) -> Tensor");
  m.def("tp_reduce(Tensor x, Tensor? bias, int group) -> Tensor");
}

TORCH_LIBRARY_IMPL(autostage, CompositeImplicitAutograd, m) {
  m.impl("tp_copy", tpCopy);
  m.impl("tp_reduce", tpReduce);
}

TensorParallelGroup::TensorParallelGroup(std::shared_ptr<comm::Backend> backend, comm::Group group) {
  std::lock_guard<std::mutex> lock(registryMutex);
  handle_ = nextHandle++;
  registry.emplace(handle_, Registered{std::move(backend), std::move(group)});
}

TensorParallelGroup::~TensorParallelGroup() {
  std::lock_guard<std::mutex> lock(registryMutex);
  registry.erase(handle_);
}

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
