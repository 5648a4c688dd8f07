#pragma once
// Coarsening (step 2 of planning): the atomic groups, in topological order, are merged into a
// linear sequence of at most max_blocks contiguous blocks. A contiguous range of a topological
// order is always convex, so every block and every stage (a range of blocks) is convex.
//
// Note [Merge order]
// Adjacent blocks are merged greedily by the smallest score
//   (weight_left + weight_right) * (smallest cut / cut between them)^4
// where weight is forward + backward time at the reference batch and cut is the bytes of BATCH
// values crossing the boundary. Boundaries with large cuts (inside a transformer or ResNet block,
// where residual and attention tensors are alive) are merged first; the cheap boundaries between
// repeated layers, where only the hidden state crosses, survive as block boundaries. The fourth
// power lets a doubled cut outweigh an up to 16x heavier merge: with boundaries pinned inside
// each layer (below), a square left a double-width cut standing next to a cheap layer boundary.
//
// Note [Non-tensor values are not cut]
// A boundary crossed by a value the runtime cannot split by samples is never a block boundary:
// a non-tensor (an int from aten::size, a list, a tuple, an optional), a tensor of unknown shape,
// or a tensor whose dim 0 is not the traced batch (a 0-dim tensor, a [batch*seq, vocab] flattening, a sequence-first
// activation, an attention mask built from sizes). Such values cannot be re-split between stages
// with different replica counts (a traced `x.size(0)` is the micro-batch size of *that* replica),
// so the groups on both sides are merged before the greedy merge, even past max_blocks. (A tensor
// whose dim 0 only happens to equal the batch stays cuttable, unless the front end marked it
// not_batch_major: Note [Rows of a value] in core/ir/type.h.) A model
// that takes `b = x.size(0)` at the start and uses it at the end therefore has one block and runs
// data-parallel; reading the size where it is used keeps the layers cuttable. The torch.export
// capture does that for the model where an operation's own operand has the size (Note [Sizes
// read where they are used] in bindings/python/autostage/export.py); TorchScript's does not.

#include <map>
#include <string>
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
  // Per degree, a line per pattern that stays replicated at it, with the reason (SplitDegrees).
  std::map<int, std::vector<std::string>> replicatedAt;
  // The patterns found (request.shardable has a span for each, three for a tied table's).
  size_t patterns = 0;
  // Per degree, the attention patterns that split at it with K and V whole (Note [Whole K/V
  // heads] in tensor_parallel_split.h).
  std::map<int, size_t> wholeKvAt;

  int blockCount() const { return static_cast<int>(blockFirstGroup.size()) - 1; }
  // Ascending ids of every node a stage of blocks [first, last] runs (attached nodes included).
  std::vector<core::NodeId> stageNodes(int firstBlock, int lastBlock) const;
};

// Groups, costs (from `profile`, indexed by node id) and coarsens to at most `maxBlocks` blocks.
// Throws PlanError when the profile does not match the graph.
// With `tensorParallel` (the options allow a degree > 1), the shardable patterns (Note
// [Tensor-parallel patterns] in tensor_parallel_patterns.h) fill request.shardable; the blocks
// are the same either way.
Blocking buildBlocking(const core::Graph& graph, const core::GraphProfile& profile, int maxBlocks,
                       double referenceBatch, bool tensorParallel = false);

// Bytes of one value as fixed + perSample * batch: per sample for BATCH tensors with a known
// shape (dim 0 is the batch), fixed for scalars; the producer's profiled output bytes split over
// its outputs when the shape is unknown.
core::LinearCost valueBytes(const core::Graph& graph, const core::GraphProfile& profile, core::ValueId value);

}  // namespace autostage::decomposer
