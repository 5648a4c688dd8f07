#pragma once
// Coarsening (step 2 of planning): the atomic groups, in topological order, are merged into a
// linear sequence of at most max_blocks contiguous blocks. A contiguous range of a topological
// order is always convex, so every block and every stage (a range of blocks) is convex.
//
// Note [Merge order]
// Adjacent blocks are merged greedily by the smallest score
//   (weight_left + weight_right) * (smallest cut / cut between them)^2
// where weight is forward + backward time at the reference batch and cut is the bytes of BATCH
// values crossing the boundary. Boundaries with large cuts (inside a transformer or ResNet block,
// where residual and attention tensors are alive) are merged first; the cheap boundaries between
// repeated layers, where only the hidden state crosses, survive as block boundaries.

#include <vector>

#include "core/ir/graph.h"
#include "core/profile.h"
#include "decomposer/atomic_groups.h"
#include "decomposer/plan.h"

namespace autostage::decomposer {

struct Blocking {
  std::vector<AtomicGroup> groups;
  std::vector<int> blockFirstGroup;  // first group of each block, then groups.size()
  // Blocks and shared parameters filled; cluster, comm, batch and options left for the caller.
  PlanRequest request;

  int blockCount() const { return static_cast<int>(blockFirstGroup.size()) - 1; }
  // Ascending ids of every node a stage of blocks [first, last] runs (attached nodes included).
  std::vector<core::NodeId> stageNodes(int firstBlock, int lastBlock) const;
};

// Groups, costs (from `profile`, indexed by node id) and coarsens to at most `maxBlocks` blocks.
// Throws PlanError when the profile does not match the graph.
Blocking buildBlocking(const core::Graph& graph, const core::GraphProfile& profile, int maxBlocks,
                       double referenceBatch);

// Bytes of one value as fixed + perSample * batch: per sample for BATCH tensors with a known
// shape (dim 0 is the batch), fixed for scalars; the producer's profiled output bytes split over
// its outputs when the shape is unknown.
core::LinearCost valueBytes(const core::Graph& graph, const core::GraphProfile& profile, core::ValueId value);

}  // namespace autostage::decomposer
