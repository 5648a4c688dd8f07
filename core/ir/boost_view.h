#pragma once
// Boost.Graph view of the IR's node dependency structure, for graph algorithms (dominators,
// strongly connected components, shortest paths over costs, ...). Vertex i is node i; there is
// one edge per distinct (producer, consumer) node pair. Built on demand; not kept in sync.

#include <boost/graph/adjacency_list.hpp>

#include "core/ir/graph.h"

namespace autostage::core {

using BoostGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS>;

BoostGraph toBoostGraph(const Graph& graph);

}  // namespace autostage::core
