#include "core/ir/boost_view.h"

namespace autostage::core {

BoostGraph toBoostGraph(const Graph& graph) {
  BoostGraph result(graph.nodeCount());
  for (const Node& n : graph.nodes())
    for (NodeId s : graph.successors(n.id)) boost::add_edge(n.id, s, result);
  return result;
}

}  // namespace autostage::core
