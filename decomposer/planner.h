#pragma once
// The whole planning pass for a graph: atomic grouping, coarsening, stage search (planStages),
// evaluation, simulation and the verified Deployment, with RaNNC-shaped partition logs:
//   [Decomposer] [info] Available device memory: N
//   [DPStaging] [info] Estimated profiles of subgraphs: batch_size=B np=N pipeline=P schedule=S
//   [DPStaging] [info] graph=STAGE_a_b repl=r tp=t zero=z fwd_time=... (ms, bytes; t: ranks per
//   replica, Note [Tensor-parallel cost])
//   [Decomposer] [info]  Assigned subgraph STAGE_a_b to rank[...]

#include <cstdint>

#include "core/cluster_spec.h"
#include "core/deployment.h"
#include "core/ir/graph.h"
#include "core/profile.h"
#include "decomposer/coarsen.h"
#include "decomposer/plan.h"
#include "decomposer/simulator.h"

namespace autostage::decomposer {

struct PlanResult {
  Blocking blocking;  // holds the PlanRequest (blocking.request), replayable via toText()
  Plan plan;
  PlanEvaluation evaluation;
  SimulationResult simulation;
  core::Deployment deployment;
  double planSeconds = 0;  // grouping + coarsening + search + deployment, excluding profiling
};

// The request for `graph`: blocks from coarsening, communication from `profile.comm`, cluster
// shape and memory from `cluster`. Throws PlanError/ConfigError on inconsistent input.
Blocking makeBlocking(const core::Graph& graph, const core::GraphProfile& profile,
                      const core::ClusterSpec& cluster, int64_t batchSize, const PlanOptions& options);

// Plans `graph`; throws PlanError (with what to change) when nothing fits in memory.
PlanResult planGraph(const core::Graph& graph, const core::GraphProfile& profile,
                     const core::ClusterSpec& cluster, int64_t batchSize, const PlanOptions& options);

// Writes the partition log lines for a finished plan.
void logPlan(const PlanRequest& request, const Plan& plan, const PlanEvaluation& evaluation);

}  // namespace autostage::decomposer
