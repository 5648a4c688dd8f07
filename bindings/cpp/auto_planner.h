#pragma once
// The planner autostage::Module uses by default: profile the imported model on this machine
// (profile cache honoured), describe the cluster the job runs on, and run the decomposer.
// Runs on rank 0 only (see staging::Module); everything it needs comes from the config table.

#include "core/cluster_spec.h"
#include "core/config.h"
#include "staging/module.h"

namespace autostage {

// The cluster this job runs on: `worldSize` CPU devices, `devicesPerNode` of them per node, each
// with an equal share of this node's physical memory; links from comm_bandwidth / comm_latency.
core::ClusterSpec localCluster(int worldSize, int devicesPerNode, const core::Config& config);

// profiler::profileGraph + decomposer::planGraph as a staging::PlanningCallback.
staging::PlanningCallback autoPlanner();

}  // namespace autostage
