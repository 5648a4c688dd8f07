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
#include "profiler/profiler.h"
#include "service/planner.h"

namespace autostage::driver {

// The profile key a job's plan call carries (Note [Profile key] in profiler/profiler.h): the
// profiler's key, and every plan input of the option table (Note [Plan inputs] in
// core/config.h) that is not a planner option (those travel in the call's options): the
// communication costs and how they are measured, and with measure_comm the ranks and nodes of
// `cluster` they are measured between. A planner that keeps a profile under this key plans with
// it, so a relaunch of the same job skips profiling; any change of what the profile or its
// communication part would be is another key.
std::string planProfileKey(const profiler::ProfileKey& key, const core::Config& config,
                           const core::ClusterSpec& cluster);

// Step 3 of Note [Where a plan comes from] (plan_sources.h): asks the job's planner
// (service::makePlanner: the planning service at planner_address, falling back to the local
// planner over plan_cache_dir; Note [One planner] in service/planner.h) for the plan by this
// model's profile key; when it keeps no profile under that key, profiles the imported model on
// this machine (profile cache honoured) and asks again with the profile. A module plans once
// per usage for the same imported model: the profile of the last (graph, example shapes) is
// kept, so that only planning runs again.
class AutoPlanner {
 public:
  // Collective when the world has several ranks and measure_comm is on: every rank measures the
  // communication profile over `backend` once per process and backend, so that planning on rank
  // 0 uses measured p2p and allreduce costs. Otherwise the configured comm_* values are used.
  // Profiles on `placement`'s device (the CUDA measurement backend for a CUDA job).
  AutoPlanner(const std::shared_ptr<comm::Backend>& backend, const Placement& placement);
  ~AutoPlanner();
  // Rank 0 only. *fromStore: the answer was kept from an earlier plan (another job's, or this
  // one's for another module), not planned for this call.
  core::Deployment plan(const PlanningInput& input, bool* fromStore);

 private:
  // The planner for these options, made again when the planner options of the config change.
  service::Planner& plannerFor(const core::Config& config);

  core::CommProfile comm_;
  Placement placement_;
  std::string profiledKey_;  // ProfileKey::text of profile_
  core::GraphProfile profile_;
  std::string plannerSettings_;  // what planner_ was made for
  std::unique_ptr<service::Planner> planner_;
};

}  // namespace autostage::driver
