#include "staging/route_check.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/pipeline_schedule.h"

namespace autostage::staging {
namespace {

const core::Route* findRoute(const core::Deployment& dep, core::ValueId value) {
  for (const core::Route& r : dep.routes)
    if (r.value == value) return &r;
  return nullptr;
}

bool travels(const core::Graph& graph, core::ValueId v) {
  core::ValueClass cls = graph.value(v).cls;
  return cls == core::ValueClass::Batch || cls == core::ValueClass::Loss;
}

void checkRouteValue(const core::Graph& graph, const core::Route& route) {
  AUTOSTAGE_CHECK_AS(PlanError, route.value >= 0 && size_t(route.value) < graph.valueCount(),
                     "route of value ", route.value, " names no value of the graph (",
                     graph.valueCount(), " values); was the deployment planned for this model?");
  const core::Value& v = graph.value(route.value);
  AUTOSTAGE_CHECK_AS(UnsupportedError, v.type.isTensor() && v.type.shapeKnown(),
                     "value '", v.name, "' crosses a stage boundary but is a ",
                     v.type.toString(), ", not a tensor of known shape; plan the stages so that "
                     "it stays inside one stage");
  if (routeKind(graph, route.value) == RouteKind::Loss) {
    AUTOSTAGE_CHECK_AS(UnsupportedError, route.consumerStages.empty() && route.graphOutput,
                       "loss value '", v.name, "' is read by another stage; only returning a "
                       "loss to the caller is supported, keep its consumers in its stage");
  }
}

void checkStageInputs(const core::Graph& graph, const core::Deployment& dep,
                      const std::vector<int>& stageOf, const core::StageDeployment& stage) {
  for (core::ValueId v : graph.boundary(stage.nodes).inputs) {
    if (!travels(graph, v)) continue;
    const core::Route* route = findRoute(dep, v);
    const std::string& name = graph.value(v).name;
    AUTOSTAGE_CHECK_AS(PlanError, route != nullptr, "stage ", stage.name, " reads value '", name,
                       "' but the deployment has no route for it; re-plan the model");
    core::NodeId producer = graph.producer(v);
    int expected = producer == core::kNoNode ? core::kFeederStage : stageOf[producer];
    AUTOSTAGE_CHECK_AS(PlanError, route->producerStage == expected, "route of value '", name,
                       "' says producer stage ", route->producerStage, " but its producer is in ",
                       expected, "; re-plan the model");
    AUTOSTAGE_CHECK_AS(PlanError, route->producerStage < stage.id, "stage ", stage.name,
                       " reads value '", name, "' from the later stage ", route->producerStage,
                       "; values flow forward through the pipeline, re-plan the model");
    const auto& consumers = route->consumerStages;
    AUTOSTAGE_CHECK_AS(PlanError,
                       std::find(consumers.begin(), consumers.end(), stage.id) != consumers.end(),
                       "stage ", stage.name, " reads value '", name,
                       "' but is not among its route's consumers; re-plan the model");
  }
}

}  // namespace

RouteKind routeKind(const core::Graph& graph, core::ValueId value) {
  const core::Value& v = graph.value(value);
  if (v.cls == core::ValueClass::Loss || v.type.shape().empty()) return RouteKind::Loss;
  return RouteKind::Rows;
}

std::vector<int> stageOfNodes(const core::Graph& graph, const core::Deployment& deployment) {
  std::vector<int> stageOf(graph.nodeCount(), -1);
  for (const core::StageDeployment& stage : deployment.stages) {
    for (core::NodeId n : stage.nodes) {
      AUTOSTAGE_CHECK_AS(PlanError, n >= 0 && size_t(n) < graph.nodeCount(), "stage ",
                         stage.name, " lists node ", n, " but the graph has ", graph.nodeCount(),
                         " nodes; was the deployment planned for this model?");
      AUTOSTAGE_CHECK_AS(PlanError, stageOf[n] < 0, "node ", n, " belongs to stages ",
                         stageOf[n], " and ", stage.id, "; a node must run in one stage");
      stageOf[n] = stage.id;
    }
  }
  return stageOf;
}

void verifyRoutes(const core::Graph& graph, const core::Deployment& deployment) {
  std::vector<int> stageOf = stageOfNodes(graph, deployment);
  for (const core::Node& node : graph.nodes()) {
    core::ValueClass cls = graph.nodeClass(node.id);
    bool needsStage = cls == core::ValueClass::Batch || cls == core::ValueClass::Loss;
    AUTOSTAGE_CHECK_AS(PlanError, !needsStage || stageOf[node.id] >= 0, "node ", node.id, " (",
                       node.kind, ") depends on the batch but is in no stage; re-plan the model");
  }
  for (const core::StageDeployment& stage : deployment.stages) {
    AUTOSTAGE_CHECK_AS(PlanError, graph.isConvex(stage.nodes), "stage ", stage.name,
                       " is not convex: a path leaves it and re-enters it; re-plan the model");
    checkStageInputs(graph, deployment, stageOf, stage);
  }
  for (const core::Route& route : deployment.routes) checkRouteValue(graph, route);
  for (core::ValueId out : graph.outputs()) {
    const core::Route* route = findRoute(deployment, out);
    AUTOSTAGE_CHECK_AS(PlanError, route != nullptr && route->graphOutput, "graph output '",
                       graph.value(out).name, "' has no route marked graphOutput; re-plan");
    AUTOSTAGE_CHECK_AS(PlanError, travels(graph, out), "graph output '", graph.value(out).name,
                       "' does not depend on the batch (", valueClassName(graph.value(out).cls),
                       "); autostage returns batch-dependent outputs only");
  }
}

}  // namespace autostage::staging

namespace autostage::staging {
namespace {

// Note [Plan usage]: a deployment (a loaded one may have been planned for another API) must run
// the schedule the call runs and budget what it holds.
void checkRunsAs(const core::Deployment& d, core::PlanUsage usage) {
  const std::string planned = core::recordedUsage(d);
  const std::string wanted = core::usageName(usage);
  const char* api = usage == core::PlanUsage::TrainStep ? "train_step" : "forward()";
  AUTOSTAGE_CHECK_AS(ConfigError,
                     usage == core::PlanUsage::TrainStep || d.schedule == "gpipe",
                     "the deployment runs schedule ", d.schedule, ", which forward() cannot run "
                     "(it runs every micro-batch's forward before any backward: gpipe); run it "
                     "with train_step(...) and a model returning its loss, use a deployment "
                     "planned for ", wanted, ", or plan again (drop load_deployment)");
  AUTOSTAGE_CHECK_AS(ConfigError,
                     usage == core::PlanUsage::Inference ||
                         planned != core::usageName(core::PlanUsage::Inference),
                     "the deployment was planned for inference (no gradients, no optimizer "
                     "state, no activations kept) but this call (", api, " with gradients) trains;"
                     " use a deployment planned for ", wanted, ", or plan again (drop "
                     "load_deployment)");
}

}  // namespace

VerifiedDeployment verifyDeployment(const core::Graph& graph, core::Deployment deployment,
                                    const DeploymentFit& fit) {
  const core::Deployment& d = deployment;
  AUTOSTAGE_CHECK_AS(ConfigError, d.worldSize == fit.worldSize, "deployment field world_size is ",
                     d.worldSize, " but this job has ", fit.worldSize, " ranks; launch with ",
                     d.worldSize, " ranks, or plan again for this world size (drop "
                     "load_deployment)");
  if (fit.plannedElsewhere) {
    AUTOSTAGE_CHECK_AS(ConfigError, d.batchSize == fit.globalBatch, "deployment field batch_size "
                       "is ", d.batchSize, " but this job's global batch is ", fit.globalBatch,
                       " (", fit.worldSize, " ranks x ", fit.globalBatch / fit.worldSize,
                       "); pass local batches of ", d.batchSize / std::max(1, d.worldSize),
                       " samples, or plan again for this batch (drop load_deployment)");
    AUTOSTAGE_CHECK_AS(ConfigError, fit.deviceMemory <= 0 || d.deviceMemory <= fit.deviceMemory,
                       "deployment field device_memory is ", d.deviceMemory, " bytes but this "
                       "job's devices have ", fit.deviceMemory, " bytes (mem_limit_gb, or this "
                       "node's memory shared by its ranks), so the plan might not fit; set "
                       "mem_limit_gb to at least ", static_cast<double>(d.deviceMemory) / (1 << 30),
                       " if the devices really have that much, or plan again (drop "
                       "load_deployment)");
    AUTOSTAGE_CHECK_AS(FormatError, d.graphHash == fit.graphHash, "deployment field graph_hash "
                       "is ", d.graphHash, " but the traced model's graph hash is ", fit.graphHash,
                       "; the deployment was planned for a different model or input shape: load "
                       "the deployment saved for this model, or plan again (drop "
                       "load_deployment)");
  }
  for (const core::StageDeployment& stage : d.stages) {
    AUTOSTAGE_CHECK_AS(ConfigError, stage.tensorParallel >= 1 && !stage.ranks.empty() &&
                                        stage.ranks.size() % stage.tensorParallel == 0,
                       "stage ", stage.name, " of the deployment has tensor-parallel degree ",
                       stage.tensorParallel, " but ", stage.ranks.size(), " ranks, which do not "
                       "form groups of that size; use a deployment planned by autostage, or plan "
                       "again (drop load_deployment)");
    AUTOSTAGE_CHECK_AS(ConfigError, fit.shardsOptimizer || !stage.zero, "stage ", stage.name,
                       " of the deployment splits its optimizer state over its replicas "
                       "(ZeRO-1, zero=1), but this module's optimizer steps whole parameters "
                       "(the C++ API's torch::optim); use a deployment planned with zero=0, or "
                       "plan again (drop load_deployment)");
  }
  checkRunsAs(d, fit.usage);
  const std::string shape = core::pipelineShapeProblem(d.schedule, core::pipelinePositions(d),
                                                       d.virtualStages, d.microBatchCount);
  AUTOSTAGE_CHECK_AS(PlanError, shape.empty(), "the deployment cannot run: ", shape,
                     " (plan again, dropping load_deployment)");
  verifyRoutes(graph, d);
  return VerifiedDeployment(std::move(deployment));
}

}  // namespace autostage::staging
