// Baselines and the planStages dispatcher.
#include "decomposer/baselines.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "decomposer/cost_model.h"
#include "decomposer/dp_stage_search.h"

namespace autostage::decomposer {
namespace {

using Cuts = std::vector<std::pair<int, int>>;

// Evaluates `cuts` with equal replica counts of `t` ranks each (the tensor-parallel degree, the
// same in every stage) over the micro-batch counts `counts`, every schedule and recompute flag;
// keeps the fastest feasible plan in `best`.
void tryCuts(const CostModel& model, const Cuts& cuts, int t, const std::vector<int>& counts,
             Plan& best, double& bestSeconds) {
  const PlanRequest& request = model.request();
  const int stages = static_cast<int>(cuts.size());
  const int replicas = request.devices / (stages * t);
  if (replicas < 1) return;
  for (int microBatches : counts) {
    int r = static_cast<int>(std::min<int64_t>(replicas, request.batchSize / microBatches));
    if (r < 1) continue;
    // Powers of two, and other counts only where they split the batch evenly over these
    // replicas (Note [Free micro-batch counts] in plan.h).
    const bool powerOfTwo = (microBatches & (microBatches - 1)) == 0;
    if (!powerOfTwo && request.batchSize % (static_cast<int64_t>(microBatches) * r) != 0) continue;
    for (Schedule schedule : request.options.scheduleCandidates()) {
      for (bool recompute : request.options.recomputeCandidates())
      for (bool zero : request.options.zeroCandidates()) {
        // One replica has nothing to shard: under zero=1 its stages run unsharded (as the DP
        // plans them), otherwise the unsharded candidate already covers it.
        if (zero && r == 1 && request.options.zero != "1") continue;
        Plan plan;
        plan.microBatchCount = microBatches;
        plan.schedule = schedule;
        for (int s = 0; s < stages; ++s)
          plan.stages.push_back(
              {cuts[s].first, cuts[s].second, r, s * r * t, recompute, zero && r > 1, t});
        // Chosen by the searched closed form, like the DP (Note [Search objective and reported
        // estimate] in cost_model.h); the reported estimate is computed for the choice only.
        PlanEvaluation e = evaluatePlanWith(model, plan, true);
        if (e.feasible && e.searchSeconds < bestSeconds) {
          bestSeconds = e.searchSeconds;
          best = plan;
        }
      }
    }
  }
}

// The fastest plan over the stage counts, the tensor-parallel degrees option tensor_parallel
// allows and the micro-batch counts `counts`, by the closed form, with decomposer and
// searchSeconds set; nullopt when none fits.
template <typename MakeCuts>
std::optional<Plan> fastestOverStageCounts(const CostModel& model, const std::string& name,
                                           const std::vector<int>& counts, MakeCuts makeCuts) {
  const PlanRequest& request = model.request();
  const int blocks = static_cast<int>(request.blocks.size());
  int lo = 1, hi = std::min(blocks, request.devices);
  if (request.options.partitionNum > 0) lo = hi = request.options.partitionNum;
  Plan best;
  double bestSeconds = std::numeric_limits<double>::infinity();
  // With nothing to shard, a degree > 1 only gives a replica more ranks to run the same work.
  std::vector<int> degrees{1};
  if (!request.shardable.empty() || request.options.tensorParallel != "auto")
    degrees = request.options.tensorParallelCandidates(request.devicesPerNode);
  for (int t : degrees)
    for (int stages = lo; stages <= hi; ++stages)
      tryCuts(model, makeCuts(stages), t, counts, best, bestSeconds);
  if (bestSeconds == std::numeric_limits<double>::infinity()) return std::nullopt;
  best.decomposer = name;
  best.searchSeconds = bestSeconds;
  return best;
}

template <typename MakeCuts>
Plan bestOverStageCounts(const PlanRequest& request, const std::string& name, MakeCuts makeCuts) {
  request.validate();
  CostModel model(request);
  std::optional<Plan> best = fastestOverStageCounts(
      model, name, request.options.microBatchCandidates(request.batchSize), makeCuts);
  AUTOSTAGE_CHECK_AS(PlanError, best.has_value(), "decomposer ", name, ": ",
                     infeasibleMessage(request));
  best->predictedSeconds = evaluatePlanWith(model, *best).iterationSeconds;
  return *best;
}

}  // namespace

Cuts uniformCuts(int blocks, int stages) {
  Cuts cuts;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    int count = blocks / stages + (s < blocks % stages ? 1 : 0);
    cuts.push_back({first, first + count - 1});
    first += count;
  }
  return cuts;
}

Cuts paramBalancedCuts(const PlanRequest& request, int stages) {
  RangeIndex index(request);
  const int blocks = index.blockCount();
  std::vector<double> prefix(blocks + 1, 0);
  for (int b = 0; b < blocks; ++b) prefix[b + 1] = prefix[b] + index.range(b, b).paramBytes;
  Cuts cuts;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    int last = blocks - 1;
    if (s + 1 < stages) {
      const double target = prefix[blocks] * (s + 1) / stages;
      last = first;
      // Leave one block for each later stage; otherwise take blocks until the target is reached.
      while (last < blocks - (stages - s) && prefix[last + 1] < target) ++last;
    }
    cuts.push_back({first, last});
    first = last + 1;
  }
  return cuts;
}

namespace {

PlanRequest singleStage(const PlanRequest& request) {
  PlanRequest single = request;
  single.options.partitionNum = 1;
  return single;
}

Cuts wholeGraph(const PlanRequest& request) {
  return Cuts{{0, static_cast<int>(request.blocks.size()) - 1}};
}

}  // namespace

Plan planDataParallel(const PlanRequest& request) {
  const PlanRequest single = singleStage(request);
  return bestOverStageCounts(single, "data_parallel", [&](int) { return wholeGraph(request); });
}

Plan planUniform(const PlanRequest& request) {
  const int blocks = static_cast<int>(request.blocks.size());
  return bestOverStageCounts(request, "uniform", [&](int s) { return uniformCuts(blocks, s); });
}

Plan planParamBalanced(const PlanRequest& request) {
  return bestOverStageCounts(request, "param_balanced",
                             [&](int s) { return paramBalancedCuts(request, s); });
}

std::vector<Plan> seedBaselines(const PlanRequest& request) {
  request.validate();
  const int blocks = static_cast<int>(request.blocks.size());
  const CostModel model(request);
  const std::vector<int> counts = request.options.microBatchCandidates(request.batchSize);
  std::vector<std::optional<Plan>> found{
      fastestOverStageCounts(model, "uniform", counts,
                             [&](int s) { return uniformCuts(blocks, s); }),
      fastestOverStageCounts(model, "param_balanced", counts,
                             [&](int s) { return paramBalancedCuts(request, s); })};
  if (request.options.partitionNum <= 1) {
    const PlanRequest single = singleStage(request);
    const CostModel singleModel(single);
    found.push_back(fastestOverStageCounts(singleModel, "data_parallel", counts,
                                           [&](int) { return wholeGraph(request); }));
  }
  std::vector<Plan> plans;
  for (std::optional<Plan>& plan : found)
    if (plan) plans.push_back(std::move(*plan));
  return plans;
}

Plan planStages(const PlanRequest& request) {
  request.validate();
  const std::string& name = request.options.decomposer;
  AUTOSTAGE_CHECK_AS(ConfigError, name == "dp" || request.options.virtualStages == "auto" ||
                                      request.options.virtualStages == "1",
                     "option virtual_stages=", request.options.virtualStages, " is searched by "
                     "decomposer=dp only (decomposer=", name, " plans one stage per rank); use "
                     "decomposer=dp or virtual_stages=auto");
  auto plan = [&name](const PlanRequest& r) {
    if (name == "data_parallel") return planDataParallel(r);
    if (name == "uniform") return planUniform(r);
    if (name == "param_balanced") return planParamBalanced(r);
    return planDynamicProgramming(r);
  };
  // Note [Micro-batch count limit] (plan.h): max_pipeline=0 tries more micro-batches only where
  // none of the first limit's counts gives a plan that fits.
  const PlanOptions& options = request.options;
  const int64_t batch = request.batchSize;
  try {
    return plan(request);
  } catch (const PlanError&) {
    if (options.maxPipeline != 0 || options.pipelineNum > 0 || batch <= options.pipelineLimit())
      throw;
    PlanRequest wider = request;
    wider.options.maxPipeline = static_cast<int>(std::min<int64_t>(batch, 1 << 30));
    core::logger("DPStaging")
        ->info(
            "No plan fits with at most {} micro-batches: searching counts up to {} (micro-batches "
            "down to one sample; max_pipeline=0, Note [Micro-batch count limit])",
            options.pipelineLimit(), wider.options.maxPipeline);
    return plan(wider);
  }
}

}  // namespace autostage::decomposer
