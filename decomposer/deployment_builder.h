#pragma once
// Turning a Plan into a core::Deployment: stage node sets, ranks, predictions, and the routes of
// every value crossing a stage boundary (Note [Routes] in core/deployment.h), verified.

#include "core/deployment.h"
#include "core/ir/graph.h"
#include "decomposer/coarsen.h"
#include "decomposer/plan.h"

namespace autostage::decomposer {

// Builds the deployment and verifies it (verifyDeployment); `evaluation` is evaluatePlan's.
core::Deployment buildDeployment(const core::Graph& graph, const Blocking& blocking,
                                 const PlanRequest& request, const Plan& plan,
                                 const PlanEvaluation& evaluation);

// Routes of every BATCH/LOSS value read by a stage other than its producer's, or returned.
std::vector<core::Route> computeRoutes(const core::Graph& graph,
                                       const std::vector<core::StageDeployment>& stages);

// Throws InternalError naming the first problem: a node in no stage or in two stages (BATCH
// nodes), a non-convex stage, a consumed value without exactly one route from its producer's
// stage, or a graph output without a route. Logs `Routes verification passed.` on success.
void verifyDeployment(const core::Graph& graph, const core::Deployment& deployment);

}  // namespace autostage::decomposer
