#pragma once
// Combining parameter gradients across ranks after backward, in buckets.
//
// Note [Gradient scaling]
// Every parameter is held by a set of ranks: the replicas of each stage that reads it (several
// stages for tied parameters, Note [Tied parameters]). Each holder's local gradient covers only
// the samples its replicas processed, and the runtime scales the gradient entering the pipeline
// from each caller by 1/worldSize (batch outputs) or by rows/globalBatch (per-micro-batch losses,
// Note [Loss outputs] in executor.h). Summing over the holder set therefore yields, on every
// holder, the gradient of the mean of the per-rank losses — what DDP's gradient averaging gives,
// and equal to the replica-group average of a single-stage data-parallel plan. One allreduce(Sum)
// per bucket does both the replica averaging and the tied-parameter sum.
//
// Buckets: the parameters of one holder set, in graph input order, packed while they share a
// dtype and stay within bucketBytes (a larger parameter gets a bucket of its own). Holder sets are
// visited in ascending order on every rank, so overlapping groups are first used in one order.
//
// Note [Buffers across replicas]
// Floating-point buffers (BatchNorm running statistics) are updated in place by every replica on
// the micro-batch pieces it runs, so replicas drift apart. After the gradients, each holder set
// averages its floating-point buffers (allreduce Average, same buckets), so every replica ends the
// step with the same running statistics: for BatchNorm's linear momentum update that is one update
// per micro-batch with the replica-averaged piece statistics. Integer buffers (num_batches_tracked)
// are left alone: every replica counts the same micro-batches.
//
// Note [Global gradient norm]
// After run(), every holder of a parameter has the same gradient. The lowest rank of each holder
// set adds the squares of that set's gradients (in double) to its partial sum; one world
// allreduce(Sum) of the partial sums gives the squared norm of the full model's gradient, each
// parameter (tied ones included) counted once — what torch.nn.utils.clip_grad_norm_ computes on
// the single-process model. Under ZeRO-1 each member of a sharded set adds the squares of the
// shard it owns instead (the shards of a set cover every element once).
//
// Note [ZeRO-1]
// A holder set all of whose stages have `zero` set (and that has >= 2 ranks) is sharded: its
// parameters that require grad are packed into buckets exactly as above, and each bucket of N
// elements is split into group-size chunks of ceil(N / size) elements (the last ones shorter or
// empty); the member at index i owns chunk i. run() reduce-scatters each bucket instead of
// allreducing it: the owner ends with the summed gradient of its chunk, and the parts of its
// .grad it does not own are zeroed. The optimizer steps only the owned pieces (shards(); the
// Python optimizer holds views of them, bindings/python/autostage/optimizer.py), and
// gatherParams() all-gathers each bucket's updated chunks into every member's parameters. Bytes
// on the wire equal the allreduce's; optimizer state per member is 1/size of the set's.

// Note [Tensor-parallel gradients]
// A tensor-parallel stage (Note [Tensor-parallel stages] in tensor_parallel.h) holds each
// sharded parameter in slices: member k of every replica group holds slice k. A slice is summed
// over the members holding it (one holder set per place in the group), so slices never mix. A
// parameter the stage reads whole (a LayerNorm's, a row-parallel bias) gets the same gradient
// on every member of a group (their inputs and output gradients are the same), so its holder
// set is every rank of the stage as usual, and each member divides its gradient by the degree
// first (Executor::allreduceGrads): the sum then counts each replica once. A whole parameter the
// pattern itself reads across the split dimension (a learnable scale of each head's features,
// broadcast over the heads: decomposer::PatternPlan::partial) gets on each member its heads'
// share of the gradient: it is summed over the same set without that division. A fused
// projection's weight with parts held whole (Note [Fused parts] in
// decomposer/tensor_parallel_split.h) is both: its groups are pieces of rows (GradientGroup::rows),
// each cut part's slice j summed over the members j, each whole part over every rank of the
// stage; ZeRO-1 leaves it whole. The global norm counts each slice once (the lowest rank of each
// slice's set), each piece once and each whole parameter once.
//
// Note [Tied tables across stages]
// A table tied to a vocabulary embedding and an LM head (Note [Tensor-parallel patterns] in
// decomposer/tensor_parallel_patterns.h) is read by two stages when a pipeline puts its ends
// apart, and each stage shards its end at its own degree (decomposer::planPatterns): member j of
// a stage of degree t holds rows [j V/t, (j+1) V/t), a stage not sharding it the whole table.
// Where every holder slices it alike, its slices are summed as any sliced parameter's (Note
// [Tensor-parallel gradients]). Where they do not (degrees 1, 2, 4, 8: each a power of two, the
// rows dividing by each), the rows are cut in T pieces, T the largest degree, and piece i is
// summed over every rank whose rows hold it, each reading it as rows of its own tensor
// (GradientGroup::rows): a stage of degree t has piece i on member i / (T / t), at row
// (i mod (T / t)) V/T. Such a group is never sharded by ZeRO-1 (its members step it whole), and
// the global norm counts each piece once. No rank holds both ends: interleaving, the only plan
// giving a rank two stages, puts the first and the last on different pipeline positions.

#include <cstdint>
#include <vector>

#include "comm/backend.h"
#include "core/deployment.h"
#include "core/ir/graph.h"
#include "staging/param_storage.h"

namespace autostage::staging {

struct GradientGroup {
  std::vector<int> ranks;               // ascending world ranks holding the parameters
  std::vector<core::ValueId> params;    // graph parameter inputs, ascending
  bool sharded = false;                 // ZeRO-1 (Note [ZeRO-1])
  // Note [Tied tables across stages], Note [Fused parts]: a piece of rows of params[0] (its only
  // parameter), at rows.offsets[k] of ranks[k]'s tensor. Empty offsets: the parameters whole.
  struct Rows {
    int64_t count = 0;
    std::vector<int64_t> offsets;
  } rows;
  bool piece() const { return !rows.offsets.empty(); }
  // What rank `rank` (a member) sums of `t` (a parameter or its gradient) in this group.
  at::Tensor part(const at::Tensor& t, int rank) const;
};

// A piece of one parameter a ZeRO-1 member owns: elements [offset, offset + length) of the
// flattened parameter (and of its gradient).
struct ShardPiece {
  core::ValueId param = -1;
  int64_t offset = 0;
  int64_t length = 0;
};

// Every parameter read by some stage, grouped by its holder set; sorted by ranks. A set is
// sharded when it has >= 2 ranks and every stage reading its parameters has `zero` set.
std::vector<GradientGroup> gradientGroups(const core::Graph& graph,
                                          const core::Deployment& deployment);

class GradientSync {
 public:
  GradientSync(std::vector<GradientGroup> groups, int64_t bucketBytes);

  // Sums the gradients of the parameters in `params` over their holder sets and averages their
  // floating-point buffers (collective over each group this rank belongs to). Parameters without
  // a gradient contribute zeros and receive one. Returns the number of allreduce calls made.
  int run(comm::Backend& backend, const ParamStorage& params) const;

  // Global L2 norm of every parameter gradient, each parameter counted once however many ranks
  // hold it (Note [Global gradient norm]); collective over the world. Call after run(), when the
  // holders of a parameter have equal gradients. Parameters without a gradient count as zero.
  double globalNorm(comm::Backend& backend, const ParamStorage& params) const;

  // The pieces of parameters `rank` owns in the sharded sets it belongs to (Note [ZeRO-1]), in
  // set, bucket and parameter order; a parameter of such a set it owns nothing of appears once
  // with length 0 (it is sharded, but not stepped here). Empty without ZeRO-1. Pure.
  std::vector<ShardPiece> shards(int rank, const ParamStorage& params) const;
  // All-gathers the owned pieces of every sharded set this rank belongs to into every member's
  // parameters (after the optimizer stepped the shards). Collective over each such set; returns
  // the number of all-gather calls.
  int gatherParams(comm::Backend& backend, const ParamStorage& params) const;
  // The same for the gradients after run(): every member ends with the whole summed gradient
  // (RaNNC's _sync_orig_params(sync_grad=True)); parameters without one receive it.
  int gatherGrads(comm::Backend& backend, const ParamStorage& params) const;
  bool anySharded() const;

 private:
  // Indices into `tensors` per bucket: consecutive tensors of one dtype within bucketBytes_.
  std::vector<std::vector<size_t>> buckets(const std::vector<at::Tensor>& tensors) const;
  // The parameters of `group` that require grad, in id order (the sharded layout's tensors).
  static std::vector<at::Tensor> trainable(const GradientGroup& group, const ParamStorage& params);
  // Reduce-scatters `grads` of one sharded set (Note [ZeRO-1]).
  // gatherParams / gatherGrads: all-gathers the owned chunk of each bucket of `pick(parameter)`.
  template <typename Pick>
  int gatherOwned(comm::Backend& backend, const ParamStorage& params, Pick pick) const;
  int scatterAll(comm::Backend& backend, const comm::Group& group,
                 const std::vector<at::Tensor>& grads) const;
  // Allreduces `tensors` in place, packed into buckets of at most bucketBytes_ of one dtype.
  int syncAll(comm::Backend& backend, const comm::Group& group,
              const std::vector<at::Tensor>& tensors, comm::ReduceOp op) const;
  int syncBucket(comm::Backend& backend, const comm::Group& group,
                 const std::vector<at::Tensor>& tensors, comm::ReduceOp op) const;
  std::vector<GradientGroup> groups_;
  int64_t bucketBytes_;
};

}  // namespace autostage::staging
