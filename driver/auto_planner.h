#pragma once
// The planner a Module uses unless given one (ModuleOptions::planner): step 3 of Note [Where a
// plan comes from] (plan_sources.h). Everything it needs comes from the config table and the
// resolved job (Note [Resolving the job]).

#include <memory>
#include <string>

#include "comm/backend.h"
#include "core/deployment.h"
#include "core/profile.h"
#include "driver/module.h"
#include "driver/placement.h"

namespace autostage::driver {

// Throws PlanError when a stage of `deployment` runs a node at a per-replica micro-batch larger
// than the largest batch it ran at while profiling (NodeProfile::failure, e.g. out of memory),
// naming the stage, the node's failure report (with its input shapes) and what to change.
void checkProfiledFeasibility(const core::Graph& graph, const core::GraphProfile& profile,
                              const core::Deployment& deployment);

// Asks the planning service at planner_address for the plan (by this model's profile key, then
// with the profile made here), else profiles the imported model on this machine (profile cache
// honoured) and runs the decomposer. A module plans once per usage for the same imported model:
// the profile of the last (graph, example shapes) is kept, so that only planning runs again.
class AutoPlanner {
 public:
  // Collective when the world has several ranks and measure_comm is on: every rank measures the
  // communication profile over `backend` once per process and backend, so that planning on rank
  // 0 uses measured p2p and allreduce costs. Otherwise the configured comm_* values are used.
  // Profiles on `placement`'s device (the CUDA measurement backend for a CUDA job).
  AutoPlanner(const std::shared_ptr<comm::Backend>& backend, const Placement& placement);
  // Rank 0 only.
  core::Deployment plan(const PlanningInput& input);

 private:
  core::CommProfile comm_;
  Placement placement_;
  std::string profiledKey_;  // graph hash + example shapes of profile_
  core::GraphProfile profile_;
};

}  // namespace autostage::driver
