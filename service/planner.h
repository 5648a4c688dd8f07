#pragma once
// The one way to get a plan: every caller (a job's rank 0, `autostage plan`, `autostage whatif`'s
// base plan) hands a Planner a plan call and takes its plan answer.
//
// Note [One planner]
// A plan call (core/proto/planner_service.proto: graph, profile or a profile key, cluster, global
// batch, the planner options as the config table names them, the usage) goes in; a plan answer
// (the deployment's bytes, the partition log, the prediction, the plan key, whether it came from
// a store) comes out. There is one plan key, computed from the call's content by the planning
// core (PlanningCore::resolve, Note [Planning service]), so a plan is found again wherever it
// was stored. Three planners:
//   - local: a PlanningCore in this process over the store at a directory (plan_cache_dir for a
//     job; none: in memory, for this process only). Its partition log is printed as it plans
//     (progress included) and replayed when the answer comes from its store;
//   - remote: the planning service at an address (`autostage serve`, planner_address), asked
//     over gRPC; the answer's partition log is replayed when it arrives;
//   - fallback: remote, then local when the remote does not answer (not running, deadline,
//     an error on its side), as planner_address promises; once it failed, later calls go to
//     the local planner directly.
// Every planner logs one line saying where the plan came from. A call that names its profile by
// profile key only is answered from what that planner keeps under the key, or fails with
// NotStored: the caller then profiles and calls again with the profile.

#include <memory>
#include <string>

#include "core/config.h"
#include "core/proto/planner_service.pb.h"
#include "service/plan_call.h"  // NotStored

namespace autostage::service {

class Planner {
 public:
  virtual ~Planner() = default;
  // Throws NotStored (a call by profile key only, none kept), PlanError (nothing fits),
  // ConfigError or FormatError (a bad call); a remote planner also ServiceUnavailable.
  virtual proto::PlanAnswer plan(const proto::PlanCall& call) = 0;
  // Where its plans come from, for the log: "the plan store at DIR", "the planning service at
  // ADDRESS", ...
  virtual std::string where() const = 0;
};

// In process, over the store at storeDirectory (empty: in memory only).
std::unique_ptr<Planner> makeLocalPlanner(const std::string& storeDirectory);
// The planning service at address (unix:PATH | tcp:PORT | tcp:HOST:PORT); a call waits at most
// timeoutSeconds for its answer.
std::unique_ptr<Planner> makeRemotePlanner(const std::string& address, double timeoutSeconds);
std::unique_ptr<Planner> makeFallbackPlanner(std::unique_ptr<Planner> remote,
                                             std::unique_ptr<Planner> local);
// A job's planner from its options: with planner_address, the service there (waiting
// planner_timeout_s) falling back to the local planner; the local planner's store is
// plan_cache_dir.
std::unique_ptr<Planner> makePlanner(const core::Config& config);

}  // namespace autostage::service
