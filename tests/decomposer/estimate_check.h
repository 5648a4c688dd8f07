#pragma once
// The check every decomposer test applies to the plans it produces: the simulator against an
// independent reference recurrence over (stage, operation), and the estimates against the
// simulator (Note [1f1b pipeline estimate] in decomposer/pipeline_time.h).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "decomposer/cost_model.h"
#include "decomposer/pipeline_time.h"
#include "decomposer/simulator.h"

namespace autostage::decomposer::testing {

// Pipeline makespan by memoised recursion: finish(stage, op) = max(finish(stage, op - 1),
// finish(the op it waits for)) + duration, with the schedules' operation orders written out here
// (1f1b warm-up min(stages - stage - 1, M), as in staging/executor.cpp).
inline double referencePipelineSeconds(const std::vector<StageTimes>& stages, int microBatches,
                                       Schedule schedule) {
  const int count = static_cast<int>(stages.size()), m = microBatches;
  std::vector<std::vector<std::pair<bool, int>>> order(count);  // (forward?, micro-batch)
  std::vector<std::vector<int>> forwardAt(count, std::vector<int>(m)), backwardAt = forwardAt;
  for (int s = 0; s < count; ++s) {
    const int warmup = schedule == Schedule::GPipe ? m : std::min(count - s - 1, m);
    for (int i = 0; i < warmup; ++i) order[s].push_back({true, i});
    for (int i = warmup; i < m; ++i) order[s].push_back({true, i}), order[s].push_back({false, i - warmup});
    for (int i = m - warmup; i < m; ++i) order[s].push_back({false, i});
    for (int p = 0; p < 2 * m; ++p) (order[s][p].first ? forwardAt : backwardAt)[s][order[s][p].second] = p;
  }
  std::vector<std::vector<double>> memo(count, std::vector<double>(2 * m, -1));
  std::function<double(int, int)> finish = [&](int s, int p) -> double {
    if (memo[s][p] >= 0) return memo[s][p];
    const auto [forward, mb] = order[s][p];
    double ready = p > 0 ? finish(s, p - 1) : 0;
    if (forward && s > 0) ready = std::max(ready, finish(s - 1, forwardAt[s - 1][mb]));
    if (!forward && s + 1 < count) ready = std::max(ready, finish(s + 1, backwardAt[s + 1][mb]));
    return memo[s][p] = ready + (forward ? stages[s].forward : stages[s].backward);
  };
  double makespan = 0;
  for (int s = 0; s < count; ++s) makespan = std::max(makespan, finish(s, 2 * m - 1));
  return makespan;
}

// Largest relative gaps seen per schedule (0 gpipe, 1 1f1b) against the simulator: of the
// planner's reported estimate (evaluatePlan's iterationSeconds), of the tight estimate recomputed
// here (estimatePipelineSeconds), and of the closed form the planners search (searchSeconds).
struct GapRecord {
  double planner[2] = {0, 0};
  double tight[2] = {0, 0};
  double search[2] = {0, 0};
  int plans[2] = {0, 0};
};
inline GapRecord& gapRecord() {
  static GapRecord record;
  return record;
}

// Checks `plan` (a plan the tests produced): the simulator equals the reference recurrence and
// the evaluator's memory; the planner's reported estimate equals the tight estimate built here
// from the stage times, is exact for gpipe, never exceeds the simulated time and is within
// `tolerance` of it. Returns the estimate's relative gap.
inline double requireEstimateMatchesSimulation(const PlanRequest& request, const Plan& plan,
                                               double tolerance = 0.05) {
  const PlanEvaluation evaluation = evaluatePlan(request, plan);
  const SimulationResult simulation = simulatePlan(request, plan);
  if (plan.virtualStages > 1) {
    // Note [Interleaved evaluation]: the reported estimate is the simulation; each position's
    // stages add up to its simulated peak (Note [Interleaved memory]).
    INFO(plan.toString());
    REQUIRE(evaluation.iterationSeconds == Approx(simulation.iterationSeconds).epsilon(1e-12));
    const size_t positions = plan.stages.size() / plan.virtualStages;
    for (size_t p = 0; p < positions; ++p) {
      double total = 0;
      for (size_t s = p; s < plan.stages.size(); s += positions)
        total += evaluation.stages[s].totalMemoryBytes;
      REQUIRE(simulation.peakMemoryBytes[p] == Approx(total).epsilon(1e-9));
    }
    return 0;
  }
  std::vector<StageTimes> times;
  for (const StageEstimate& e : evaluation.stages)
    times.push_back({e.forwardSeconds + e.sendForwardSeconds, e.backwardSeconds + e.sendBackwardSeconds});
  const double reference = referencePipelineSeconds(times, plan.microBatchCount, plan.schedule);
  const double simulated = simulation.iterationSeconds;
  const double tight = estimatePipelineSeconds(times, plan.microBatchCount, plan.schedule) +
                       evaluation.allreduceSeconds;
  const double tightGap = (simulated - tight) / simulated;
  const double plannerGap = (simulated - evaluation.iterationSeconds) / simulated;
  const double searchGap = std::abs(simulated - evaluation.searchSeconds) / simulated;
  INFO(plan.toString() << "\nplanner " << evaluation.iterationSeconds << " tight " << tight
                       << " search " << evaluation.searchSeconds << " simulated " << simulated);
  REQUIRE(simulation.pipelineSeconds == Approx(reference).epsilon(1e-9));
  REQUIRE(evaluation.iterationSeconds == Approx(tight).epsilon(1e-12));
  if (plan.schedule == Schedule::GPipe) {
    REQUIRE(std::abs(plannerGap) <= 1e-9);
    REQUIRE(searchGap <= 1e-9);  // the closed form is exact for gpipe
  }
  REQUIRE(plannerGap >= -1e-9);  // a path length of the schedule: never above it
  REQUIRE(plannerGap <= tolerance);
  for (size_t s = 0; s < plan.stages.size(); ++s)
    REQUIRE(simulation.peakMemoryBytes[s] == Approx(evaluation.stages[s].totalMemoryBytes).epsilon(1e-9));
  GapRecord& record = gapRecord();
  const int slot = plan.schedule == Schedule::OneFOneB ? 1 : 0;
  record.planner[slot] = std::max(record.planner[slot], plannerGap);
  record.tight[slot] = std::max(record.tight[slot], tightGap);
  record.search[slot] = std::max(record.search[slot], searchGap);
  ++record.plans[slot];
  return plannerGap;
}

}  // namespace autostage::decomposer::testing
