#pragma once
// A planning call as it travels to the planning service (core/proto/planner_service.proto), and
// its answer made here: the one place that turns a graph, profile, cluster, batch and planner
// options into a PlanAnswer, used by the service and by `autostage whatif` without one.

#include <cstdint>
#include <string>

#include "core/cluster_spec.h"
#include "core/error.h"
#include "core/ir/graph.h"
#include "core/profile.h"
#include "core/proto/planner_service.pb.h"
#include "decomposer/plan.h"

namespace autostage::service {

// A call that names its profile by profile_key only, when the service has none under that key.
class NotStored : public Error {
  using Error::Error;
};

// The call carrying the files themselves (graph, profile, cluster) and the options; with a null
// profile it carries no profile (set profile_hash or profile_key).
proto::PlanCall makePlanCall(const core::Graph& graph, const core::GraphProfile* profile,
                             const core::ClusterSpec& cluster, int64_t batchSize,
                             const decomposer::PlanOptions& options);
inline proto::PlanCall makePlanCall(const core::Graph& graph, const core::GraphProfile& profile,
                                    const core::ClusterSpec& cluster, int64_t batchSize,
                                    const decomposer::PlanOptions& options) {
  return makePlanCall(graph, &profile, cluster, batchSize, options);
}

// The planner options of a call: the defaults, then each config key it names. Throws
// ConfigError naming an unknown key or a bad value.
decomposer::PlanOptions optionsOf(const proto::PlanCall& call);

// Throws PlanError when a stage of `deployment` runs a node at a per-replica micro-batch larger
// than the largest batch it ran at while profiling (NodeProfile::failure, e.g. out of memory),
// naming the stage, the node's failure report (with its input shapes) and what to change.
void checkProfiledFeasibility(const core::Graph& graph, const core::GraphProfile& profile,
                              const core::Deployment& deployment);

// Plans (decomposer::planGraph), refuses a plan checkProfiledFeasibility refuses, and fills the
// answer: the deployment file bytes, the partition
// log lines (captured; printed as well with echo), the prediction, how the plan was made
// (phases, graph and block counts). Throws PlanError when nothing fits.
proto::PlanAnswer answerPlan(const core::Graph& graph, const core::GraphProfile& profile,
                             const core::ClusterSpec& cluster, int64_t batchSize,
                             const decomposer::PlanOptions& options, bool echo = false);

// "2,2,1": replicas of each stage of a deployment (or of its file's bytes).
std::string replicasOf(const std::string& deploymentBytes);
std::string replicasOf(const core::Deployment& deployment);
// "1,2,2": ranks per replica (tensor-parallel degree) of each stage.
std::string tensorParallelOf(const core::Deployment& deployment);

}  // namespace autostage::service
