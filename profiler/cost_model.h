#pragma once
// The composed cost model: predicts a block's (a convex node subset's) forward/backward time and
// peak memory from per-node profiles. Pure and torch-free so the planner can share the formula.
//
// Note [Block composition]
//   time(block, b)   = calibration * sum over profiled nodes of time_n(b)
//   memory(block, b) = params * (2 + optParamFactor)          (weights, grads, optimizer state)
//                    + 2 * bytes of floating boundary inputs (received activations, and their
//                                                             gradients, all alive at the end
//                                                             of backward)
//                    + sum of activation_n(b)                (kept from forward for backward)
//                    + bytes of the block's boundary outputs (held until backward)
//                    + bytes of its floating boundary outputs (the gradients received for them)
//                    + max over nodes of working_n(b)        (temporaries of the busiest node,
//                                                             beyond its own input/output grads)
// The doubled boundary terms match the decomposer's communication buffers (2 * (in + out)).
// Node groups (see nodeGroups) are keyed by their BATCH/LOSS node; PARAM/CONST nodes carry no
// time of their own and are covered by the calibration factor.

#include <cstdint>
#include <vector>

#include "core/ir/graph.h"
#include "core/profile.h"

namespace autostage::profiler {

// One BATCH/LOSS node with the PARAM/CONST nodes that feed only it (directly or through each
// other). `nodes` is ascending and ends with `key`.
struct NodeGroup {
  core::NodeId key = core::kNoNode;
  std::vector<core::NodeId> nodes;
};

// The node groups of a graph, in key order. PARAM/CONST nodes feeding several groups, or none,
// belong to no group.
std::vector<NodeGroup> nodeGroups(const core::Graph& graph);

// Parameter bytes owned by each node: every PARAM graph input is charged to the first
// BATCH/LOSS node reached from it through PARAM/CONST nodes (kNoNode-free; indexed by node id).
std::vector<int64_t> paramBytesByNode(const core::Graph& graph);

// Batch size the graph's recorded shapes belong to (dim 0 of the first BATCH tensor input).
int64_t exampleBatchSize(const core::Graph& graph);

struct BlockPrediction {
  double forwardSeconds = 0;
  double backwardSeconds = 0;
  int64_t paramBytes = 0;
  int64_t activationBytes = 0;
  int64_t inputBytes = 0;    // floating boundary inputs produced by other nodes (stage inputs)
  int64_t outputBytes = 0;   // boundary outputs
  int64_t outputGradBytes = 0;  // floating boundary outputs (their gradients come back)
  int64_t workingBytes = 0;  // max over nodes
  int64_t peakBytes = 0;     // per Note [Block composition]
  bool feasible = true;      // false when a node failed at (or below) this batch size
  double seconds() const { return forwardSeconds + backwardSeconds; }
};

// Throws PlanError when the profile does not cover the graph or a node id is out of range.
BlockPrediction predictBlock(const core::Graph& graph, const core::GraphProfile& profile,
                             const std::vector<core::NodeId>& nodes, int64_t batch,
                             double optParamFactor);

// Least-squares fit of value = fixed + perSample * batch, kept non-negative: a negative slope
// becomes a constant (the mean), a negative intercept a line through the origin.
core::LinearCost fitLinear(const std::vector<double>& batches, const std::vector<double>& values);

}  // namespace autostage::profiler
