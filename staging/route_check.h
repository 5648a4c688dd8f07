#pragma once
// Checks a deployment's stages and routes against the graph it is executed on, before anything
// runs, so a stale or hand-edited deployment fails with a PlanError instead of a hang.
//
// Checked: every node id exists and belongs to at most one stage; every BATCH/LOSS node belongs
// to a stage; every stage is convex; every batch value a stage reads from outside has a route
// from the right producer (the stage holding its producer node, or the feeder for model inputs)
// that lists the stage as a consumer; every graph output has a route marked graphOutput; routed
// values are tensors with a known shape; LOSS values are only returned to the caller.

#include <string>

#include "core/deployment.h"
#include "core/ir/graph.h"

namespace autostage::staging {

// How a routed value moves (Note [Sample ranges], Note [Loss outputs] in executor.h).
enum class RouteKind { Rows, Loss };
// Rows for BATCH tensors with a batch dimension; Loss for LOSS values and 0-dim tensors.
RouteKind routeKind(const core::Graph& graph, core::ValueId value);

// Throws PlanError naming the stage, node, value or route at fault and what to do.
void verifyRoutes(const core::Graph& graph, const core::Deployment& deployment);

// Index of the stage holding each node (-1: none).
std::vector<int> stageOfNodes(const core::Graph& graph, const core::Deployment& deployment);

}  // namespace autostage::staging
