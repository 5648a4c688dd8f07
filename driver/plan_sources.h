#pragma once
// Where rank 0 takes a plan from (Note [Where a plan comes from]), and the partition log lines of
// the plan it took.

#include <string>

#include "core/deployment.h"

namespace autostage::driver {

// Note [Where a plan comes from]
// Rank 0 takes the plan for a call from the first source that has one, and logs which:
//   1. the deployment file (load_deployment / ModuleOptions::deploymentPath), for the module's
//      first deployment only (Note [Saved deployments] in module.h); every rank reads it;
//   2. the plan cache (plan_cache_dir; Note [Plan cache] in plan_cache.h);
//   3. the planner: ModuleOptions::planner when given, otherwise the AutoPlanner (auto_planner.h):
//      the planning service by this model's profile key (planner_address), else a profile made
//      here (or the one this model already has), then the planning service with that profile,
//      else the decomposer here.
// A plan from 1 or 2 was made for another job and is checked against this one as well (graph,
// batch, memory: Note [One verification] in staging/route_check.h). A plan from 3 is written to
// the plan cache as planned and, with save_deployment, to deployment_file with this job's hosts
// (Note [Hosts of a deployment] in core/deployment.h). A dry run (partitioning_dry_run_np) skips 1
// and 2, plans for its world size and ends the job.

// The `[DPStaging] Deployment: ...` lines: stages, micro-batches, schedule, usage, replicas, ranks.
void logDeployment(const core::Deployment& deployment);

}  // namespace autostage::driver
