#pragma once
// Atomic grouping (step 1 of planning): one group per BATCH/LOSS node (a node reading or writing a
// BATCH/LOSS value), together with the PARAM/CONST nodes that feed it. A PARAM/CONST node feeding
// several groups is replicated into each, so a parameter's producer is never cut from its
// consumer. PARAM/CONST nodes feeding no group (dead code) join the first group.

#include <vector>

#include "core/ir/graph.h"

namespace autostage::decomposer {

struct AtomicGroup {
  core::NodeId main = core::kNoNode;   // the BATCH/LOSS node
  std::vector<core::NodeId> attached;  // PARAM/CONST nodes it needs, ascending (may repeat across groups)
  std::vector<core::ValueId> params;   // PARAM graph inputs it reads (directly or via attached), ascending
};

// True when the node reads or writes a BATCH or LOSS value.
bool isBatchNode(const core::Graph& graph, core::NodeId node);

// Groups in node (topological) order. Throws PlanError when the graph has no BATCH node.
std::vector<AtomicGroup> atomicGroups(const core::Graph& graph);

}  // namespace autostage::decomposer
