// Atomic grouping; see atomic_groups.h.
#include "decomposer/atomic_groups.h"

#include <algorithm>

#include "core/error.h"

namespace autostage::decomposer {
namespace {

bool isBatchValue(const core::Value& v) {
  return v.cls == core::ValueClass::Batch || v.cls == core::ValueClass::Loss;
}

// Collects the non-batch producers (transitively) and PARAM inputs behind `node`'s inputs.
// `mark` holds the group index that last visited a node, so each group visits a node once.
void collectFeeders(const core::Graph& graph, core::NodeId node, int group, std::vector<int>& mark,
                    std::vector<int>& inputMark, AtomicGroup& out) {
  std::vector<core::NodeId> stack{node};
  while (!stack.empty()) {
    core::NodeId current = stack.back();
    stack.pop_back();
    for (core::ValueId v : graph.node(current).inputs) {
      const core::Value& value = graph.value(v);
      if (value.producer == core::kNoNode) {
        if (value.cls == core::ValueClass::Param && inputMark[v] != group) {
          inputMark[v] = group;
          out.params.push_back(v);
        }
        continue;
      }
      if (isBatchNode(graph, value.producer) || mark[value.producer] == group) continue;
      mark[value.producer] = group;
      out.attached.push_back(value.producer);
      stack.push_back(value.producer);
    }
  }
}

}  // namespace

bool isBatchNode(const core::Graph& graph, core::NodeId node) {
  const core::Node& n = graph.node(node);
  for (core::ValueId v : n.inputs)
    if (isBatchValue(graph.value(v))) return true;
  for (core::ValueId v : n.outputs)
    if (isBatchValue(graph.value(v))) return true;
  return false;
}

std::vector<AtomicGroup> atomicGroups(const core::Graph& graph) {
  std::vector<AtomicGroup> groups;
  std::vector<int> mark(graph.nodeCount(), -1), inputMark(graph.valueCount(), -1);
  std::vector<char> covered(graph.nodeCount(), 0);
  for (const core::Node& n : graph.nodes()) {
    if (!isBatchNode(graph, n.id)) continue;
    AtomicGroup g;
    g.main = n.id;
    collectFeeders(graph, n.id, static_cast<int>(groups.size()), mark, inputMark, g);
    std::sort(g.attached.begin(), g.attached.end());
    std::sort(g.params.begin(), g.params.end());
    covered[n.id] = 1;
    for (core::NodeId a : g.attached) covered[a] = 1;
    groups.push_back(std::move(g));
  }
  AUTOSTAGE_CHECK_AS(PlanError, !groups.empty(), "graph '", graph.name(), "' has no operation on ",
                     "its batch inputs (", graph.nodeCount(), " nodes; its outputs are its inputs ",
                     "or constants), so there is nothing to partition: call the model directly, ",
                     "or, for a C++ IR, mark the inputs whose dim 0 is the batch as BATCH");
  AtomicGroup& first = groups.front();
  for (const core::Node& n : graph.nodes())
    if (!covered[n.id]) first.attached.push_back(n.id);
  std::sort(first.attached.begin(), first.attached.end());
  return groups;
}

}  // namespace autostage::decomposer
