#pragma once
// The planner autostage::Module uses by default: profile the imported model on this machine
// (profile cache honoured), describe the cluster the job runs on, and run the decomposer.
// Runs on rank 0 only (see staging::Module); everything it needs comes from the config table.

#include <memory>

#include "comm/backend.h"
#include "core/cluster_spec.h"
#include "core/config.h"
#include "core/deployment.h"
#include "core/profile.h"
#include "staging/module.h"

namespace autostage {

// The cluster this job runs on: `worldSize` CPU devices, `devicesPerNode` of them per node, each
// with an equal share of this node's physical memory; links from comm_bandwidth / comm_latency.
core::ClusterSpec localCluster(int worldSize, int devicesPerNode, const core::Config& config);

// The memory per device a plan made now would assume (what Deployment::deviceMemory records):
// mem_limit_gb if set, otherwise this node's physical memory over the ranks sharing it.
int64_t jobDeviceMemory(const core::Config& config);

// Throws PlanError when a stage of `deployment` runs a node at a per-replica micro-batch larger
// than the largest batch it ran at while profiling (NodeProfile::failure, e.g. out of memory),
// naming the stage, the node's failure report (with its input shapes) and what to change.
void checkProfiledFeasibility(const core::Graph& graph, const core::GraphProfile& profile,
                              const core::Deployment& deployment);

// profiler::profileGraph + decomposer::planGraph as a staging::PlanningCallback.
// Collective when the world has several ranks: every rank must call autoPlanner (the
// autostage::Module constructor does), which measures the communication profile over `backend`
// (null: the shared "mpi" backend) once, so that planning on rank 0 uses measured p2p and
// allreduce costs. On one rank the configured comm_* values are used.
staging::PlanningCallback autoPlanner(std::shared_ptr<comm::Backend> backend = nullptr);

}  // namespace autostage
