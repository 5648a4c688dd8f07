#pragma once
// The collectives of a tensor-parallel stage (Note [Tensor-parallel stages] in
// staging/tensor_parallel.h), as dispatcher operators that both executors (TorchScript and the
// torch.export interpreter) call and autograd differentiates:
//   autostage::tp_copy(Tensor x, int group) -> Tensor           identity; backward all-reduces
//   autostage::tp_slice(Tensor x, int dim, int block, int degree, int group) -> Tensor
//                 the member's part of each block along dim (Note [Whole K/V heads] in
//                 decomposer/tensor_parallel_split.h); backward: zeros outside it
//   autostage::tp_reduce(Tensor x, Tensor? bias, int group) -> Tensor
//                                                  all-reduce (sum) then + bias; backward identity
//   autostage::tp_embedding(Tensor weight, Tensor indices, int padding_idx, int group) -> Tensor
//                    the member's rows of a vocabulary table (ids elsewhere read zeros), summed
//                    over the group (all-reduce forward, identity backward)
//   autostage::tp_dropout(Tensor x, float p, bool train, int split, int group) -> Tensor
//                                 dropout with the group's masks (Note [Tensor-parallel dropout])
//   autostage::tp_log_softmax(Tensor x, int dim, int group) -> Tensor
//   autostage::tp_nll_loss(Tensor x, Tensor target, int reduction, int ignore_index,
//                          int group) -> Tensor
//   autostage::tp_cross_entropy(Tensor x, Tensor target, int reduction, int ignore_index,
//                               float label_smoothing, int group) -> Tensor
//                the loss of logits split over the vocabulary (Note [Vocabulary-parallel loss])
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
// tensor-parallel stage (torch.rand, bernoulli, ...) draw from the default generators, which the
// runner seeds alike on every member around the stage's run (Note [Tensor-parallel random
// operators] in stage_runner.h).
//
// Note [Vocabulary-parallel loss]
// An LM head split over the vocabulary leaves each member the logits of its classes
// ([j V/t, (j+1) V/t)), as Megatron-LM's parallel cross entropy does; the loss never gathers
// them. tp_log_softmax subtracts the log-sum-exp over all classes: each member's own over its
// slice, gathered by one all-reduce of a [t, rows] tensor (member m fills row m; a stable
// log-sum-exp of those t values, so no max all-reduce is needed). The whole log-sum-exp is
// subtracted from the member's slice through tp_copy: each member's log-probabilities give it
// part of that value's gradient (the target's owner the nll's, every member its classes'
// softmax), and the backward all-reduce sums the parts before they go back to each member's
// row and slice. tp_nll_loss picks each row's target among the member's classes (zero where the
// target is another member's) and all-reduces the one pick per row; rows whose target is
// ignore_index count zero and are left out of the mean. tp_cross_entropy (classes in dimension
// 1) computes each row's (1 - e) (lse - x_target) + e (lse - sum(x) / classes) for label
// smoothing e from the gathered log-sum-exp and one all-reduce of the target's logit (and the
// row's logit sum), and its own backward, on the member's slice alone and with no collective:
// (softmax - (1 - e) one-hot - e / classes) times the row's gradient; it keeps the logits and
// the log-sum-exp. Class weights and class-probability targets are not split (the rewrite leaves
// such a head replicated). The forward all-reduces are identity backward: every member computes
// the same loss and differentiates it into its own slice; the head's input gradient is summed by
// its tp_copy.

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
  // A seed from the stream, the same on every member, drawn as one draw (Note [Tensor-parallel
  // random operators] in stage_runner.h).
  uint64_t nextSeed();

 private:
  std::shared_ptr<GroupState> state_;
  int64_t handle_;
};

// Member `index`'s slice of a full parameter (a contiguous copy), as `shard` says.
at::Tensor shardTensor(const at::Tensor& full, const ParamShard& shard, int degree, int index);
// The full tensor, of `extent` indices along shard.dim, from every member's slice (`slices` in
// member order): shardTensor's inverse (a whole part is taken from the first member's).
at::Tensor unshardTensor(const std::vector<at::Tensor>& slices, const ParamShard& shard,
                         int64_t extent);
// Gives `param` the data `data` (a slice of it, or the whole it was cut from: Note [Sharing
// sliced parameters] in checkpoint.cpp) and drops a gradient whose shape no longer fits.
void replaceParamData(const at::Tensor& param, const at::Tensor& data);

}  // namespace autostage::staging
