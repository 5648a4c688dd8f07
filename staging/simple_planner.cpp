#include "staging/simple_planner.h"

#include <set>
#include <sstream>

#include "core/error.h"

namespace autostage::staging {
namespace {

core::StageDeployment makeStage(int id, int begin, int end, int replicas, bool recompute) {
  core::StageDeployment stage;
  stage.id = id;
  stage.name = "STAGE_" + std::to_string(begin) + "_" + std::to_string(end - 1);
  for (int n = begin; n < end; ++n) stage.nodes.push_back(n);
  for (int r = 0; r < replicas; ++r) stage.ranks.push_back(id * replicas + r);
  stage.recompute = recompute;
  return stage;
}

void addRoutes(const core::Graph& graph, const std::vector<int>& stageOf, core::Deployment* d) {
  for (const core::Value& v : graph.values()) {
    if (v.cls != core::ValueClass::Batch && v.cls != core::ValueClass::Loss) continue;
    int producer = v.producer == core::kNoNode ? core::kFeederStage : stageOf[v.producer];
    std::set<int> consumers;
    for (const core::Use& use : v.uses)
      if (stageOf[use.node] != producer) consumers.insert(stageOf[use.node]);
    bool output = graph.isGraphOutput(v.id);
    if (consumers.empty() && !output) continue;
    core::Route route;
    route.value = v.id;
    route.producerStage = producer;
    route.consumerStages.assign(consumers.begin(), consumers.end());
    route.graphOutput = output;
    route.carriesGradient = v.type.isTensor() && core::isFloatingPoint(v.type.dtype());
    d->routes.push_back(route);
  }
}

}  // namespace

void UniformPlanOptions::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError, stageCount >= 1, "stage count must be >= 1, got ", stageCount);
  AUTOSTAGE_CHECK_AS(ConfigError, microBatchCount >= 1, "micro-batch count must be >= 1, got ",
                     microBatchCount);
  AUTOSTAGE_CHECK_AS(ConfigError, schedule == "gpipe" || schedule == "1f1b",
                     "schedule must be 'gpipe' or '1f1b', got '", schedule, "'");
}

std::string UniformPlanOptions::toString() const {
  std::ostringstream out;
  out << "stages=" << stageCount << " micro_batches=" << microBatchCount
      << " schedule=" << schedule << " recompute=" << (recompute ? "true" : "false");
  return out.str();
}

core::Deployment uniformPlan(const core::Graph& graph, int worldSize, int64_t batchSize,
                             const UniformPlanOptions& options) {
  options.validate();
  const int stages = options.stageCount;
  const int nodes = static_cast<int>(graph.nodeCount());
  AUTOSTAGE_CHECK_AS(ConfigError, worldSize % stages == 0, "cannot place ", stages,
                     " stages with equal replicas on ", worldSize, " ranks; pick a divisor");
  AUTOSTAGE_CHECK_AS(ConfigError, nodes >= stages, "the graph has ", nodes,
                     " nodes, fewer than the ", stages, " stages asked for");
  core::Deployment d;
  d.graphHash = graph.hash();
  d.worldSize = worldSize;
  d.batchSize = batchSize;
  d.microBatchCount = options.microBatchCount;
  d.schedule = options.schedule;
  d.decomposer = "uniform";
  std::vector<int> stageOf(nodes);
  for (int s = 0; s < stages; ++s) {
    int begin = nodes * s / stages, end = nodes * (s + 1) / stages;
    for (int n = begin; n < end; ++n) stageOf[n] = s;
    d.stages.push_back(makeStage(s, begin, end, worldSize / stages, options.recompute));
  }
  addRoutes(graph, stageOf, &d);
  d.options["planner"] = options.toString();
  return d;
}

PlanningCallback uniformPlanner(UniformPlanOptions options) {
  options.validate();
  return [options](const PlanningInput& in) {
    return uniformPlan(in.model.graph, in.worldSize, in.globalBatch, options);
  };
}

}  // namespace autostage::staging
