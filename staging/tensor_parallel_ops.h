#pragma once
// The collectives of a tensor-parallel stage (Note [Tensor-parallel stages] in
// staging/tensor_parallel.h), as dispatcher operators that both executors (TorchScript and the
// torch.export interpreter) call and autograd differentiates:
//   autostage::tp_copy(Tensor x, int group) -> Tensor           identity; backward all-reduces
//   autostage::tp_reduce(Tensor x, Tensor? bias, int group) -> Tensor
//                                                  all-reduce (sum) then + bias; backward identity
//   autostage::tp_embedding(Tensor weight, Tensor indices, int padding_idx, int group) -> Tensor
//                    the member's rows of a vocabulary table (ids elsewhere read zeros), summed
//                    over the group (all-reduce forward, identity backward)
//   autostage::tp_dropout(Tensor x, float p, bool train, int split, int group) -> Tensor
//                                 dropout with the group's masks (Note [Tensor-parallel dropout])
// `group` is a handle from TensorParallelGroup: the comm backend, the group's ranks, this rank's
// place among them and the group's random stream.
//
// Note [Tensor-parallel dropout]
// The members of a group each compute the stage's replicated activations in full, so a dropout
// there must drop the same elements on every member, or their copies of one activation (and the
// gradients of the replicated parameters) part ways. Every dropout of a tensor-parallel stage is
// therefore rewritten to tp_dropout, whose mask comes from the group's own stream instead of the
// rank's default generator: draw k uses a generator seeded with mix(seed, k), the same on every
// member when the activation is replicated (`split` 0), and with mix(seed, k, member) when it is
// split (`split` 1: each member's heads get masks of their own, as Megatron-LM's model-parallel
// generator gives them). The seed is the first member's torch.initial_seed(), agreed when the
// group is made; the count of draws is the stream's whole state, so a recompute stage saves it
// with its forward and restores it for the re-run, which draws the same masks. A mask of CPU
// tensors comes from a CPU generator made for the draw; one of CUDA tensors from the device's
// default generator, seeded for the draw and then put back as it was. Other random operators in a
// tensor-parallel stage (torch.rand, bernoulli, ...) still draw from each rank's own generator:
// the rewrite names them.

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "comm/backend.h"
#include "staging/tensor_parallel.h"

namespace autostage::staging {

struct GroupState;

// A group's handle for the operators, registered while the object lives. Collective over
// `group` (this rank is its member `member`): the members agree on the first one's seed.
class TensorParallelGroup {
 public:
  TensorParallelGroup(std::shared_ptr<comm::Backend> backend, comm::Group group, int member);
  ~TensorParallelGroup();
  TensorParallelGroup(const TensorParallelGroup&) = delete;
  TensorParallelGroup& operator=(const TensorParallelGroup&) = delete;
  int64_t handle() const { return handle_; }
  // The group's random stream (Note [Tensor-parallel dropout]): its seed and the draws made.
  uint64_t seed() const;
  uint64_t draws() const;
  void setDraws(uint64_t draws);

 private:
  std::shared_ptr<GroupState> state_;
  int64_t handle_;
};

// Member `index`'s slice of a full parameter (a contiguous copy), as `shard` says.
at::Tensor shardTensor(const at::Tensor& full, const ParamShard& shard, int degree, int index);
// The full tensor from every member's slice (`slices` in member order): shardTensor's inverse.
at::Tensor unshardTensor(const std::vector<at::Tensor>& slices, const ParamShard& shard);

}  // namespace autostage::staging
