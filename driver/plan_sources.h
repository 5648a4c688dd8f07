#pragma once
// Where rank 0 takes a plan from (Note [Where a plan comes from]), and the partition log lines of
// the plan it took.

#include <string>

#include "core/config.h"
#include "core/deployment.h"

namespace autostage::driver {

// Note [Where a plan comes from]
// How a job gets its plan. Rank 0 takes the plan for a call from the first source that has
// one, logs which, broadcasts it, and every rank verifies it:
//   1. the deployment file (load_deployment / ModuleOptions::deploymentPath), for the module's
//      first deployment only (Note [Saved deployments] in module.h); every rank reads it;
//   2. the planner: ModuleOptions::planner when given, otherwise the AutoPlanner
//      (auto_planner.h), which asks the job's service::Planner (Note [One planner] in
//      service/planner.h: the planning service at planner_address, falling back to the local
//      planner, whose store is plan_cache_dir) first by this model's profile key, so a planner
//      that keeps this model's profile (a relaunch) answers without profiling, and from its
//      store when the same plan was made before; otherwise profiles here and asks again with the
//      profile.
// A plan from 1, or from a planner's store, was made for another job and is checked against
// this one as well (graph, batch, memory: Note [One verification] in staging/route_check.h). A
// plan made for this call is, with save_deployment, written to deployment_file with this job's
// hosts (Note [Hosts of a deployment] in core/deployment.h). A dry run (partitioning_dry_run_np)
// skips 1, plans for its world size and ends the job.

// Note [Choosing ZeRO-1 for a module]
// ZeRO-1 needs an optimizer that steps only this rank's pieces of the parameters. Whoever wraps
// the optimizer (autostage.Module in Python, autostage::Module in C++) says what stops that
// (`problem`: empty when nothing does; its text before the first ';' is why, the rest what to
// do) and whether the model has trainable parameters; this decides, once for both APIs:
//   - zero=0, or no problem with trainable parameters: the process-wide option stands;
//   - no trainable parameters: nothing to shard, the module plans with zero=0 (said for zero=1);
//   - zero=1 with a problem: UnsupportedError with the problem;
//   - zero=auto with a problem: the module plans with zero=0, and says why.
// Returns true when the module plans with zero=0: its own plan option (Note [Per-module plan
// options] in plan_sources.cpp), so other modules of the process keep theirs.
bool plansWithoutZero(const core::Config& config, bool trainable, const std::string& problem);

// The `[DPStaging] Deployment: ...` lines: stages, micro-batches, schedule, usage, replicas, ranks.
void logDeployment(const core::Deployment& deployment);

}  // namespace autostage::driver
