#pragma once
// The collectives of a tensor-parallel stage (Note [Tensor-parallel stages] in
// staging/tensor_parallel.h), as dispatcher operators that both executors (TorchScript and the
// torch.export interpreter) call and autograd differentiates:
//   autostage::tp_copy(Tensor x, int group) -> Tensor           identity; backward all-reduces
//   autostage::tp_reduce(Tensor x, Tensor? bias, int group) -> Tensor
//                                                  all-reduce (sum) then + bias; backward identity
// `group` is a handle from TensorParallelGroup: the comm backend and the group's ranks.

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "comm/backend.h"
#include "staging/tensor_parallel.h"

namespace autostage::staging {

// A group's handle for the operators, registered while the object lives.
class TensorParallelGroup {
 public:
  TensorParallelGroup(std::shared_ptr<comm::Backend> backend, comm::Group group);
  ~TensorParallelGroup();
  TensorParallelGroup(const TensorParallelGroup&) = delete;
  TensorParallelGroup& operator=(const TensorParallelGroup&) = delete;
  int64_t handle() const { return handle_; }

 private:
  int64_t handle_;
};

// Member `index`'s slice of a full parameter (a contiguous copy), as `shard` says.
at::Tensor shardTensor(const at::Tensor& full, const ParamShard& shard, int degree, int index);
// The full tensor from every member's slice (`slices` in member order): shardTensor's inverse.
at::Tensor unshardTensor(const std::vector<at::Tensor>& slices, const ParamShard& shard);

}  // namespace autostage::staging
