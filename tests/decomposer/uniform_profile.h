#pragma once
// A profile for coarsening and blocking tests in which only the graph's cuts matter.

#include "core/ir/graph.h"
#include "core/profile.h"

namespace autostage::decomposer::testing {

// Every node costs the same (1 ms + 0.1 ms per sample forward), so only cuts decide blocks.
inline core::GraphProfile uniformProfile(const core::Graph& g) {
  core::GraphProfile profile;
  profile.graphHash = g.hash();
  profile.nodes.resize(g.nodeCount());
  for (auto& p : profile.nodes) p.forwardSeconds = {1e-3, 1e-4};
  return profile;
}

}  // namespace autostage::decomposer::testing
