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
// the single-process model.

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
};

// Every parameter read by some stage, grouped by its holder set; sorted by ranks.
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

 private:
  // Allreduces `tensors` in place, packed into buckets of at most bucketBytes_ of one dtype.
  int syncAll(comm::Backend& backend, const comm::Group& group,
              const std::vector<at::Tensor>& tensors, comm::ReduceOp op) const;
  int syncBucket(comm::Backend& backend, const comm::Group& group,
                 const std::vector<at::Tensor>& tensors, comm::ReduceOp op) const;
  std::vector<GradientGroup> groups_;
  int64_t bucketBytes_;
};

}  // namespace autostage::staging
