// Note [Interleaved search] in interleaved_search.h.
#include "decomposer/interleaved_search.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace autostage::decomposer {
namespace {

// Greedy cut under `limit`: each range takes blocks while its sum stays within the limit and
// enough blocks remain for the later ranges. Empty when the last range exceeds the limit.
std::vector<std::pair<int, int>> greedyCuts(const std::vector<double>& cost, int parts,
                                            double limit) {
  const int n = static_cast<int>(cost.size());
  std::vector<std::pair<int, int>> cuts;
  int first = 0;
  for (int k = 0; k < parts; ++k) {
    const int laterParts = parts - k - 1;
    int last = first;
    double sum = cost[first];
    if (k + 1 == parts) {
      last = n - 1;
      sum = std::accumulate(cost.begin() + first, cost.end(), 0.0);
    } else {
      while (last + 1 < n - laterParts && sum + cost[last + 1] <= limit) sum += cost[++last];
    }
    if (sum > limit) return {};
    cuts.push_back({first, last});
    first = last + 1;
  }
  return cuts;
}

// Each block's compute on one rank of a stage of degree t (a pattern over several blocks counted
// whole: the cut is a heuristic, the evaluation of the plan exact).
std::vector<double> chunkCosts(const CostModel& model, double microBatch, bool recompute, int t) {
  std::vector<double> cost;
  for (int b = 0; b < model.ranges().blockCount(); ++b) {
    const RangeTotals block = model.member(model.ranges().range(b, b), b, b, t, false).range;
    const double forward = block.forwardSeconds.at(microBatch);
    cost.push_back(forward * (recompute ? 2 : 1) + block.backwardSeconds.at(microBatch));
  }
  return cost;
}

}  // namespace

std::vector<std::pair<int, int>> minMaxCuts(const std::vector<double>& cost, int parts) {
  AUTOSTAGE_INTERNAL_ASSERT(parts >= 1 && parts <= static_cast<int>(cost.size()),
                            "cannot cut ", cost.size(), " blocks into ", parts, " ranges");
  double low = *std::max_element(cost.begin(), cost.end());
  double high = std::accumulate(cost.begin(), cost.end(), 0.0);
  if (auto cuts = greedyCuts(cost, parts, low); cuts.size() == size_t(parts)) return cuts;
  for (int i = 0; i < 60 && high - low > 1e-12 * high; ++i) {
    const double mid = 0.5 * (low + high);
    (greedyCuts(cost, parts, mid).size() == size_t(parts) ? high : low) = mid;
  }
  return greedyCuts(cost, parts, high * (1 + 1e-12));
}

bool positionsTile(int devices, int positions, int t) {
  return positions >= 2 && devices % (positions * t) == 0;
}

namespace {

// The fastest feasible plan found so far.
struct BestPlan {
  std::optional<Plan> plan;
  double seconds = std::numeric_limits<double>::infinity();
};

// An interleaved plan of `cuts` (positions * virtualStages chunks, chunk k on position
// k % positions), each position `replicas` groups of t ranks.
Plan interleavedPlan(const std::vector<std::pair<int, int>>& cuts, int positions, int replicas,
                     int t, int microBatches, int virtualStages, bool recompute, bool zero) {
  Plan plan;
  plan.microBatchCount = microBatches;
  plan.schedule = Schedule::OneFOneB;
  plan.virtualStages = virtualStages;
  for (size_t k = 0; k < cuts.size(); ++k)
    plan.stages.push_back({cuts[k].first, cuts[k].second, replicas,
                           static_cast<int>(k % positions) * replicas * t, recompute, zero, t});
  return plan;
}

// The candidates with every stage at tensor-parallel degree t (Note [Tensor-parallel cost]): a
// position's replicas are groups of t ranks, each on one node.
void searchDegree(const CostModel& model, int virtualStages, int t, BestPlan& best) {
  const PlanRequest& request = model.request();
  const PlanOptions& options = request.options;
  const int blocks = model.ranges().blockCount();
  for (int positions = 2; positions <= std::min(request.devices / t, blocks / virtualStages);
       ++positions) {
    if (!positionsTile(request.devices, positions, t)) continue;
    if (options.partitionNum > 0 && positions * virtualStages != options.partitionNum) continue;
    const int replicas = request.devices / (positions * t);
    for (int microBatches : options.microBatchCandidates(request.batchSize)) {
      if (microBatches % positions != 0 ||
          static_cast<int64_t>(microBatches) * replicas > request.batchSize)
        continue;
      const double mb = static_cast<double>(model.microBatchPerReplica(microBatches, replicas));
      for (bool recompute : options.recomputeCandidates()) {
        const auto cuts =
            minMaxCuts(chunkCosts(model, mb, recompute, t), positions * virtualStages);
        for (bool zero : options.zeroCandidates()) {
          if (zero && replicas == 1) continue;  // nothing to shard
          Plan plan = interleavedPlan(cuts, positions, replicas, t, microBatches, virtualStages,
                                      recompute, zero);
          const PlanEvaluation e = evaluatePlanWith(model, plan);
          if (!e.feasible || e.iterationSeconds >= best.seconds) continue;
          best.seconds = plan.predictedSeconds = plan.searchSeconds = e.iterationSeconds;
          best.plan = std::move(plan);
        }
      }
    }
  }
}

}  // namespace

std::optional<Plan> searchInterleaved(const CostModel& model, int virtualStages,
                                      Refinement* refinement) {
  BestPlan found;
  for (int t : model.request().options.tensorParallelCandidates(model.request().devicesPerNode))
    searchDegree(model, virtualStages, t, found);
  if (!found.plan) return std::nullopt;
  // Note [Simulated refinement]: from the family's fastest plan to a local optimum.
  const Refinement refined = refinePlan(model, *found.plan, kRefineWork);
  if (refinement) *refinement = refined;
  if (refined.seconds < found.seconds) {
    found.plan = refined.plan;
    found.plan->predictedSeconds = found.plan->searchSeconds = refined.seconds;
  }
  return found.plan;
}

}  // namespace autostage::decomposer
