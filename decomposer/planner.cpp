// planGraph and the partition log; see planner.h.
#include "decomposer/planner.h"

#include <chrono>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "decomposer/deployment_builder.h"

namespace autostage::decomposer {

Blocking makeBlocking(const core::Graph& graph, const core::GraphProfile& profile,
                      const core::ClusterSpec& cluster, int64_t batchSize, const PlanOptions& options) {
  options.validate();
  AUTOSTAGE_CHECK_AS(ConfigError, cluster.devices >= 1 && cluster.devicesPerNode >= 1,
                     "cluster devices=", cluster.devices, " devices_per_node=", cluster.devicesPerNode,
                     "; both must be >= 1");
  AUTOSTAGE_CHECK_AS(ConfigError, batchSize >= 1, "batch size ", batchSize, " must be >= 1");
  Blocking blocking = buildBlocking(graph, profile, options.maxBlocks, static_cast<double>(batchSize),
                                    options.tensorParallel != "1");
  PlanRequest& r = blocking.request;
  if (options.tensorParallel != "1" && r.shardable.empty()) {
    // Note [Tensor-parallel patterns]: nothing to shard, so every degree > 1 only replicates.
    const std::string why = "graph " + graph.name() + " has no operations tensor parallelism " +
                            "shards (linear layers feeding each other through element-wise " +
                            "operations, attention, a vocabulary-sized embedding or LM head: " +
                            "Note [Tensor-parallel patterns]; autostage.shard_patterns lists them)";
    AUTOSTAGE_CHECK_AS(ConfigError, options.tensorParallel == "auto", "option tensor_parallel=",
                       options.tensorParallel, " cannot be planned: ", why,
                       "; set tensor_parallel=1 (or auto)");
    core::logger("Decomposer")->info("tensor_parallel=auto: {}; planning without it", why);
  } else if (options.tensorParallel != "1") {
    // The degrees searched at which patterns stay replicated (ShardableSpan::degrees), and a
    // forced degree at which all do, which would only copy the stages.
    for (int t : options.tensorParallelCandidates(cluster.devicesPerNode)) {
      auto whole = blocking.wholeKvAt.find(t);
      if (whole != blocking.wholeKvAt.end())
        core::logger("Decomposer")
            ->info(
                "tensor_parallel: {} attention pattern(s) compute K and V whole on each of {} "
                "ranks: their K/V heads do not divide by {} (Note [Whole K/V heads])",
                whole->second, t, t);
      auto it = blocking.replicatedAt.find(t);
      if (it == blocking.replicatedAt.end()) continue;
      const std::vector<std::string>& lines = it->second;
      AUTOSTAGE_CHECK_AS(
          ConfigError, lines.size() < blocking.patterns || options.tensorParallel == "auto",
          "option tensor_parallel=", t, " cannot be planned: none of the ", blocking.patterns,
          " pattern(s) of graph ", graph.name(), " splits over ", t, " ranks (e.g. ", lines.front(),
          "); set tensor_parallel=auto or a ", "degree they split at");
      core::logger("Decomposer")
          ->info(
              "tensor_parallel: {} of {} pattern(s) stay replicated in "
              "a group of {} ranks, e.g. {}",
              lines.size(), blocking.patterns, t, lines.front());
    }
    core::logger("Decomposer")
        ->info(
            "tensor_parallel={}: {} pattern(s) to shard in graph {} "
            "(Note [Tensor-parallel patterns])",
            options.tensorParallel, blocking.patterns, graph.name());
  }
  r.comm = profile.comm;
  r.devices = cluster.devices;
  r.devicesPerNode = cluster.devicesPerNode;
  r.deviceMemory = static_cast<double>(cluster.memoryPerDevice);
  r.batchSize = batchSize;
  for (core::ValueId out : graph.outputs())  // a scalar loss has no per-sample bytes
    r.outputBytesPerSample += valueBytes(graph, profile, out).perSample;
  r.options = options;
  r.validate();
  return blocking;
}

void logPlan(const PlanRequest& request, const Plan& plan, const PlanEvaluation& evaluation) {
  auto dp = core::logger("DPStaging");
  dp->info("Estimated profiles of subgraphs: batch_size={} np={} pipeline={} schedule={} v={} "
           "precision={} usage={}", request.batchSize, request.devices, plan.microBatchCount,
           scheduleName(plan.schedule), plan.virtualStages, request.options.precision,
           usageName(request.options.usage));
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& p = plan.stages[s];
    const StageEstimate& e = evaluation.stages[s];
    dp->info("graph=STAGE_{}_{} repl={} tp={} zero={} fwd_time={:.3f} bwd_time={:.3f} ar_time={:.3f} in_size={:.0f} "
             "out_size={:.0f} param_size={:.0f} total_mem={:.0f} (fwd+bwd={:.0f} opt={:.0f} comm={:.0f} "
             "cast={:.0f})",
             p.firstBlock, p.lastBlock, p.replicaCount, p.tensorParallel, p.zero ? 1 : 0, e.forwardSeconds * 1e3, e.backwardSeconds * 1e3,
             e.allreduceSeconds * 1e3, e.inputBytes, e.outputBytes, e.paramBytes, e.totalMemoryBytes,
             e.paramBytes + e.gradientBytes + e.activationBytes + e.workingBytes, e.optimizerBytes,
             e.commBufferBytes, e.castCacheBytes);
  }
  auto log = core::logger("Decomposer");
  for (const StagePlan& p : plan.stages) {
    std::string ranks;
    for (int r = 0; r < p.rankCount(); ++r) {  // a replica's tensor-parallel group in [ ]
      const bool first = r % p.tensorParallel == 0, last = (r + 1) % p.tensorParallel == 0;
      ranks += std::string(r ? "," : "") + (first && p.tensorParallel > 1 ? "[" : "") +
               std::to_string(p.firstRank + r) + (last && p.tensorParallel > 1 ? "]" : "");
    }
    log->info(" Assigned subgraph STAGE_{}_{} to rank[{}]", p.firstBlock, p.lastBlock, ranks);
  }
}

PlanResult planGraph(const core::Graph& graph, const core::GraphProfile& profile,
                     const core::ClusterSpec& cluster, int64_t batchSize, const PlanOptions& options) {
  auto start = std::chrono::steady_clock::now();
  auto log = core::logger("Decomposer");
  log->info("Planner options: {}", options.toString());
  PlanResult result;
  result.blocking = makeBlocking(graph, profile, cluster, batchSize, options);
  const double blockingSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const PlanRequest& request = result.blocking.request;
  log->info("Available device memory: {:.0f}", request.memoryLimit());
  log->info("Graph {}: {} nodes, {} atomic groups, {} blocks", graph.name(), graph.nodeCount(),
            result.blocking.groups.size(), result.blocking.blockCount());
  result.plan = planStages(request);
  auto& phases = result.plan.phaseSeconds;
  phases.insert(phases.begin(), {"blocking (atomic groups, coarsening)", blockingSeconds});
  PhaseClock clock(phases);
  result.evaluation = evaluatePlan(request, result.plan);
  AUTOSTAGE_INTERNAL_ASSERT(result.evaluation.feasible, "planner returned an infeasible plan: ",
                            result.evaluation.problem);
  logPlan(request, result.plan, result.evaluation);
  result.deployment = buildDeployment(graph, result.blocking, request, result.plan, result.evaluation);
  clock.mark("evaluation and deployment");
  result.planSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.simulation = simulatePlan(request, result.plan);
  clock.mark("simulation (not in plan_seconds)");
  return result;
}

}  // namespace autostage::decomposer
