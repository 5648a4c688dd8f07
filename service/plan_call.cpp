#include "service/plan_call.h"

#include <algorithm>
#include <sstream>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/proto/cluster_file.h"
#include "core/proto/deployment_file.h"
#include "core/proto/graph_file.h"
#include "core/proto/profile_file.h"
#include "decomposer/plan_option_fields.h"
#include "decomposer/planner.h"

namespace autostage::service {

proto::PlanCall makePlanCall(const core::Graph& graph, const core::GraphProfile* profile,
                             const core::ClusterSpec& cluster, int64_t batchSize,
                             const decomposer::PlanOptions& options) {
  proto::PlanCall call;
  call.set_graph(core::encodeGraph(graph));
  if (profile) call.set_profile(core::encodeProfile(*profile));
  call.set_cluster(core::encodeClusterSpec(cluster));
  call.set_batch_size(batchSize);
  // Note [Plan option fields]: config key names and text; usage travels on its own.
  for (const std::string& key : decomposer::planOptionKeys())
    (*call.mutable_options())[key] = decomposer::planOptionText(options, key);
  call.set_usage(decomposer::usageName(options.usage));
  return call;
}

decomposer::PlanOptions optionsOf(const proto::PlanCall& call) {
  core::Config config;  // defaults, not this process's config: the caller's options decide
  const std::vector<std::string>& keys = decomposer::planOptionKeys();
  for (const auto& [key, value] : call.options()) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::string names;
      for (const std::string& k : keys) names += (names.empty() ? "" : ", ") + k;
      throw ConfigError("planning call option '" + key +
                        "' is not a planner option; the planner options are " + names);
    }
    config.set(key, value, "planning call");  // checked as a config value of that key
  }
  decomposer::PlanOptions options = decomposer::PlanOptions::fromConfig(config);
  options.usage = decomposer::parseUsage(call.usage().empty() ? "train_step" : call.usage());
  options.validate();
  return options;
}

void checkProfiledFeasibility(const core::Graph& graph, const core::GraphProfile& profile,
                              const core::Deployment& deployment) {
  for (const core::StageDeployment& stage : deployment.stages) {
    int64_t shares = int64_t{deployment.microBatchCount} * std::max(1, stage.replicaCount());
    int64_t micro = (deployment.batchSize + shares - 1) / shares;
    for (core::NodeId n : stage.nodes) {
      const core::NodeProfile& p = profile.nodes.at(n);
      if (p.failure.empty() || (p.maxBatch >= 0 && micro <= p.maxBatch)) continue;
      AUTOSTAGE_CHECK_AS(PlanError, false, "stage ", stage.name, " would run ",
                         core::nodeLabel(graph, n), " at micro-batch size ", micro,
                         ", but profiling it failed: ", p.failure, "; largest batch it ran at: ",
                         p.maxBatch, ". Use a smaller batch, more micro-batches or more ranks");
    }
  }
}

proto::PlanAnswer answerPlan(const core::Graph& graph, const core::GraphProfile& profile,
                             const core::ClusterSpec& cluster, int64_t batchSize,
                             const decomposer::PlanOptions& options, bool echo) {
  proto::PlanAnswer answer;
  core::LogCapture capture(echo);
  decomposer::PlanResult result =
      decomposer::planGraph(graph, profile, cluster, batchSize, options);
  // The decomposer does not read NodeProfile::failure yet: such plans are refused here, for
  // every planner.
  checkProfiledFeasibility(graph, profile, result.deployment);
  answer.set_deployment(core::encodeDeployment(result.deployment));
  for (const std::string& line : capture.lines()) answer.add_log(line);
  answer.set_iteration_seconds(result.evaluation.iterationSeconds);
  answer.set_peak_bytes(static_cast<int64_t>(result.evaluation.peakMemoryBytes));
  answer.set_stages(static_cast<int>(result.deployment.stages.size()));
  answer.set_micro_batches(result.deployment.microBatchCount);
  answer.set_schedule(core::scheduleText(result.deployment));
  answer.set_plan_seconds(result.planSeconds);
  for (const auto& [name, seconds] : result.plan.phaseSeconds) {
    proto::PlanPhase* phase = answer.add_phases();
    phase->set_name(name);
    phase->set_seconds(seconds);
  }
  answer.set_graph_nodes(graph.nodeCount());
  answer.set_blocks(result.blocking.blockCount());
  answer.set_search_objective_seconds(result.evaluation.searchSeconds);
  return answer;
}

std::string replicasOf(const std::string& deploymentBytes) {
  return replicasOf(core::decodeDeployment(deploymentBytes, "planning answer"));
}

std::string replicasOf(const core::Deployment& deployment) {
  std::string text;
  for (const core::StageDeployment& stage : deployment.stages)
    text += (text.empty() ? "" : ",") + std::to_string(stage.replicaCount());
  return text;
}

std::string tensorParallelOf(const core::Deployment& deployment) {
  std::string text;
  for (const core::StageDeployment& stage : deployment.stages)
    text += (text.empty() ? "" : ",") + std::to_string(stage.tensorParallel);
  return text;
}

}  // namespace autostage::service
