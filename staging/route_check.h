#pragma once
// Checks a deployment's stages and routes against the graph it is executed on, before anything
// runs, so a stale or hand-edited deployment fails with a PlanError instead of a hang.
//
// Checked: every node id exists and belongs to at most one stage; every BATCH/LOSS node belongs
// to a stage; every stage is convex; every batch value a stage reads from outside has a route
// from the right producer (the stage holding its producer node, or the feeder for model inputs)
// that lists the stage as a consumer; every graph output has a route marked graphOutput; routed
// values are tensors with a known shape; LOSS values are only returned to the caller.

#include <cstdint>
#include <string>
#include <vector>

#include "core/deployment.h"
#include "core/ir/graph.h"
#include "core/plan_usage.h"

namespace autostage::staging {

// How a routed value moves (Note [Sample ranges], Note [Loss outputs] in executor.h).
enum class RouteKind { Rows, Loss };
// Rows for BATCH tensors with a batch dimension; Loss for LOSS values and 0-dim tensors.
RouteKind routeKind(const core::Graph& graph, core::ValueId value);

// Throws PlanError naming the stage, node, value or route at fault and what to do.
void verifyRoutes(const core::Graph& graph, const core::Deployment& deployment);

// Note [One verification]
// Every deployment a module runs is checked once, by verifyDeployment, on every rank (the caller
// agrees on the outcome: driver/module.cpp), whatever it came from: a deployment file, the plan
// cache, the planning service or a planner. It checks the routes against the graph (above) and
// that the deployment fits the job (DeploymentFit), naming the field that does not. The Executor
// takes only a VerifiedDeployment, so it cannot run an unchecked one and does not check again.

// What a deployment must fit besides its graph.
struct DeploymentFit {
  int worldSize = 1;
  // The API the deployment will run (Note [Plan usage]): its schedule and what it budgets.
  core::PlanUsage usage = core::PlanUsage::TrainStep;
  // A deployment planned elsewhere (a deployment file, a planner's store) must also have been
  // planned for this graph, this global batch and at most this device memory (Note [Saved
  // deployments] in driver/module.h); a planner working for this job plans for them.
  bool plannedElsewhere = false;
  std::string graphHash;
  int64_t globalBatch = 0;
  int64_t deviceMemory = 0;  // 0: not checked
  // The caller's optimizer can step ZeRO-1 pieces; false refuses a deployment with zero stages.
  bool shardsOptimizer = true;
};

class VerifiedDeployment {
 public:
  const core::Deployment& get() const { return deployment_; }
  core::Deployment release() && { return std::move(deployment_); }

 private:
  friend VerifiedDeployment verifyDeployment(const core::Graph&, core::Deployment,
                                             const DeploymentFit&);
  explicit VerifiedDeployment(core::Deployment deployment) : deployment_(std::move(deployment)) {}
  core::Deployment deployment_;
};

// Throws PlanError (routes), ConfigError (the job) or FormatError (another graph) naming what
// does not fit and what to do.
VerifiedDeployment verifyDeployment(const core::Graph& graph, core::Deployment deployment,
                                    const DeploymentFit& fit);

// Index of the stage holding each node (-1: none).
std::vector<int> stageOfNodes(const core::Graph& graph, const core::Deployment& deployment);

}  // namespace autostage::staging
