// Plan -> Deployment, routes and their verification; see deployment_builder.h.
#include "decomposer/deployment_builder.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "decomposer/atomic_groups.h"

namespace autostage::decomposer {
namespace {

bool isBatchValue(const core::Value& v) {
  return v.cls == core::ValueClass::Batch || v.cls == core::ValueClass::Loss;
}

// Stage of every BATCH node (-1 for PARAM/CONST nodes, which may be replicated).
std::vector<int> batchNodeStages(const core::Graph& graph, const std::vector<core::StageDeployment>& stages) {
  std::vector<int> stageOf(graph.nodeCount(), -1);
  for (const core::StageDeployment& s : stages)
    for (core::NodeId id : s.nodes)
      if (isBatchNode(graph, id)) {
        AUTOSTAGE_INTERNAL_ASSERT(stageOf[id] < 0, "node ", id, " (", graph.node(id).kind,
                                  ") is in stages ", stageOf[id], " and ", s.id);
        stageOf[id] = s.id;
      }
  return stageOf;
}

// Values that depend on a parameter (their gradient matters), by forward propagation.
std::vector<char> dependsOnParams(const core::Graph& graph) {
  std::vector<char> depends(graph.valueCount(), 0);
  for (core::ValueId v : graph.paramInputs()) depends[v] = 1;
  for (const core::Node& n : graph.nodes()) {
    bool any = false;
    for (core::ValueId v : n.inputs) any = any || depends[v];
    for (core::ValueId v : n.outputs) depends[v] = any;
  }
  return depends;
}

// Note [Replicated nodes in a stage]
// Atomic grouping copies a PARAM/CONST node into every block that reads it, so stage node lists
// can share such nodes, and a shared one makes a stage non-convex (a path leaves the stage
// through it into an earlier stage and comes back). A stage therefore keeps a PARAM/CONST node
// only when every consumer of it is kept in the same stage (decided in reverse topological
// order); the runtime recomputes the others from parameters (Note [Routes]). Kept sets are convex:
// nothing kept feeds a node outside the stage except through BATCH values, which routes carry.
std::vector<core::NodeId> ownedNodes(const core::Graph& graph, const std::vector<core::NodeId>& nodes) {
  std::vector<char> kept(graph.nodeCount(), 0);
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    core::NodeId id = *it;
    if (isBatchNode(graph, id)) {
      kept[id] = 1;
      continue;
    }
    bool owned = true, used = false;
    for (core::ValueId v : graph.node(id).outputs) {
      owned = owned && !graph.isGraphOutput(v);
      for (core::NodeId c : graph.consumers(v)) used = true, owned = owned && kept[c];
    }
    kept[id] = owned && used;
  }
  std::vector<core::NodeId> result;
  for (core::NodeId id : nodes)
    if (kept[id]) result.push_back(id);
  return result;
}

core::StageDeployment makeStage(const core::Graph& graph, const Blocking& blocking, const StagePlan& p, const StageEstimate& e, int id) {
  core::StageDeployment s;
  s.id = id;
  s.name = "STAGE_" + std::to_string(p.firstBlock) + "_" + std::to_string(p.lastBlock);
  s.nodes = ownedNodes(graph, blocking.stageNodes(p.firstBlock, p.lastBlock));
  // Replica i on ranks [firstRank + i t, firstRank + (i + 1) t) (StagePlan's layout).
  for (int r = 0; r < p.rankCount(); ++r) s.ranks.push_back(p.firstRank + r);
  s.tensorParallel = p.tensorParallel;
  s.recompute = p.recompute;
  s.zero = p.zero && p.replicaCount > 1;
  s.forwardSeconds = e.forwardSeconds;
  s.backwardSeconds = e.backwardSeconds;
  s.allreduceSeconds = e.allreduceSeconds;
  s.inputBytes = static_cast<int64_t>(e.inputBytes);
  s.outputBytes = static_cast<int64_t>(e.outputBytes);
  s.paramBytes = static_cast<int64_t>(e.paramBytes);
  s.activationBytes = static_cast<int64_t>(e.activationBytes);
  s.optimizerBytes = static_cast<int64_t>(e.optimizerBytes);
  s.commBufferBytes = static_cast<int64_t>(e.commBufferBytes);
  s.totalMemoryBytes = static_cast<int64_t>(e.totalMemoryBytes);
  s.sendForwardSeconds = e.sendForwardSeconds;
  s.sendBackwardSeconds = e.sendBackwardSeconds;
  s.microBatchPerReplica = e.microBatchPerReplica;
  s.gradientBytes = static_cast<int64_t>(e.gradientBytes);
  s.workingBytes = static_cast<int64_t>(e.workingBytes);
  return s;
}

std::map<std::string, std::string> optionMap(const PlanOptions& options) {
  std::map<std::string, std::string> result;
  std::istringstream in(options.toString());
  std::string item;
  while (in >> item) {
    size_t eq = item.find('=');
    result[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return result;
}

}  // namespace

std::vector<core::Route> computeRoutes(const core::Graph& graph,
                                       const std::vector<core::StageDeployment>& stages) {
  std::vector<int> stageOf = batchNodeStages(graph, stages);
  std::vector<char> depends = dependsOnParams(graph);
  std::vector<core::Route> routes;
  for (const core::Value& v : graph.values()) {
    if (!isBatchValue(v)) continue;
    core::Route r;
    r.value = v.id;
    r.producerStage = v.producer == core::kNoNode ? core::kFeederStage : stageOf[v.producer];
    for (const core::Use& u : v.uses) {
      int s = stageOf[u.node];
      if (s >= 0 && s != r.producerStage) r.consumerStages.push_back(s);
    }
    std::sort(r.consumerStages.begin(), r.consumerStages.end());
    r.consumerStages.erase(std::unique(r.consumerStages.begin(), r.consumerStages.end()), r.consumerStages.end());
    r.graphOutput = graph.isGraphOutput(v.id);
    r.carriesGradient = depends[v.id] && v.type.isTensor() && isFloatingPoint(v.type.dtype());
    if (!r.consumerStages.empty() || r.graphOutput) routes.push_back(std::move(r));
  }
  return routes;
}

void verifyDeployment(const core::Graph& graph, const core::Deployment& d) {
  std::vector<int> stageOf = batchNodeStages(graph, d.stages);
  for (const core::Node& n : graph.nodes())
    AUTOSTAGE_INTERNAL_ASSERT(!isBatchNode(graph, n.id) || stageOf[n.id] >= 0, "node ", n.id, " (",
                              n.kind, ") is in no stage");
  for (const core::StageDeployment& s : d.stages)
    AUTOSTAGE_INTERNAL_ASSERT(graph.isConvex(s.nodes), "stage ", s.name, " is not convex");
  std::map<core::ValueId, const core::Route*> byValue;
  for (const core::Route& r : d.routes) {
    AUTOSTAGE_INTERNAL_ASSERT(byValue.emplace(r.value, &r).second, "value ", r.value, " has two routes");
  }
  for (const core::StageDeployment& s : d.stages) {
    for (core::NodeId id : s.nodes) {
      for (core::ValueId v : graph.node(id).inputs) {
        const core::Value& value = graph.value(v);
        if (!isBatchValue(value)) continue;
        int producer = value.producer == core::kNoNode ? core::kFeederStage : stageOf[value.producer];
        if (producer == s.id) continue;
        auto it = byValue.find(v);
        AUTOSTAGE_INTERNAL_ASSERT(it != byValue.end(), "stage ", s.name, " reads value '", value.name,
                                  "' but no route carries it");
        const core::Route& r = *it->second;
        AUTOSTAGE_INTERNAL_ASSERT(r.producerStage == producer, "route of '", value.name,
                                  "' starts at stage ", r.producerStage, ", producer is ", producer);
        AUTOSTAGE_INTERNAL_ASSERT(std::binary_search(r.consumerStages.begin(), r.consumerStages.end(), s.id),
                                  "route of '", value.name, "' does not reach stage ", s.name);
      }
    }
  }
  for (core::ValueId v : graph.outputs())
    AUTOSTAGE_INTERNAL_ASSERT(!isBatchValue(graph.value(v)) || (byValue.count(v) && byValue[v]->graphOutput),
                              "graph output '", graph.value(v).name, "' has no route to the caller");
  // The user-facing line is the driver's, after every rank verified what it runs (DPStaging).
  core::logger("Decomposer")->debug("Routes verification passed (deployment builder).");
}

core::Deployment buildDeployment(const core::Graph& graph, const Blocking& blocking,
                                 const PlanRequest& request, const Plan& plan,
                                 const PlanEvaluation& evaluation) {
  AUTOSTAGE_INTERNAL_ASSERT(evaluation.stages.size() == plan.stages.size(),
                            "evaluation does not match the plan");
  core::Deployment d;
  d.graphHash = graph.hash();
  d.worldSize = request.devices;
  d.devicesPerNode = request.devicesPerNode;
  d.deviceMemory = static_cast<int64_t>(request.deviceMemoryBytes());
  d.batchSize = request.batchSize;
  d.microBatchCount = plan.microBatchCount;
  d.schedule = scheduleName(plan.schedule);
  d.virtualStages = plan.virtualStages;
  d.decomposer = plan.decomposer;
  for (size_t s = 0; s < plan.stages.size(); ++s)
    d.stages.push_back(makeStage(graph, blocking, plan.stages[s], evaluation.stages[s], static_cast<int>(s)));
  d.routes = computeRoutes(graph, d.stages);
  d.options = optionMap(request.options);
  d.predictedIterationSeconds = evaluation.iterationSeconds;
  verifyDeployment(graph, d);
  return d;
}

}  // namespace autostage::decomposer
