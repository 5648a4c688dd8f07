#pragma once
// The whole plan space of a small request, enumerated, and the planner's plan quality measured
// against it (dp_stage_search_test.cpp asserts on it, bench/plan_scaling --quality prints it).
// Header-only, over the decomposer's public API.

#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "decomposer/cost_model.h"
#include "decomposer/dp_stage_search.h"
#include "decomposer/simulator.h"
#include "random_requests.h"

namespace autostage::decomposer::testing {

constexpr double kNoPlan = std::numeric_limits<double>::infinity();

// Brute force: every cut set x replica vector x tensor-parallel degree vector (from the options'
// candidates; ranks replicas x degree, summing to <= devices) x recompute vector x ZeRO-1 vector
// (replicated stages only) x micro-batch count x schedule, stages laid out on consecutive ranks
// ending at the last rank (the DP's layout), a stage of degree t > 1 starting at a multiple of t
// (Note [Tensor-parallel cost]).
// The objective is composed here from CostModel::stage, independently of the DP and evaluator.
// With `simulate`, it also keeps the smallest simulated iteration time over the same plans.
class Exhaustive {
 public:
  explicit Exhaustive(const PlanRequest& request, bool simulate = false)
      : request_(request), model_(request), simulate_(simulate) {}

  double best() {
    for (int m : request_.options.microBatchCandidates(request_.batchSize))
      for (Schedule s : request_.options.scheduleCandidates()) {
        microBatches_ = m;
        schedule_ = s;
        chooseStage(0, 0);
      }
    return best_;
  }
  double bestSimulated() const { return bestSimulated_; }
  // The plan of bestSimulated(), for messages.
  std::string bestSimulatedPlan() const { return bestSimulatedPlan_; }

 private:
  struct Stage {
    int first, last, replicas;
    bool recompute;
    bool zero;
    int tensorParallel;
  };

  void chooseStage(int firstBlock, int devicesUsed) {
    const int n = static_cast<int>(request_.blocks.size());
    if (firstBlock == n) return score(devicesUsed);
    for (int last = firstBlock; last < n; ++last)
      for (int r = 1; devicesUsed + r <= request_.devices; ++r)
        for (int t : tensorParallel_) {
          if (devicesUsed + r * t > request_.devices) continue;
          for (bool recompute : {false, true})
            for (bool zero : {false, true}) {
              if (zero && r == 1) continue;  // one replica has nothing to shard
              stages_.push_back({firstBlock, last, r, recompute, zero, t});
              chooseStage(last + 1, devicesUsed + r * t);
              stages_.pop_back();
            }
        }
  }

  void score(int devicesUsed) {
    const int count = static_cast<int>(stages_.size());
    if (request_.options.partitionNum > 0 && count != request_.options.partitionNum) return;
    double sum = 0, maxForward = 0, maxBackward = 0, maxStage = 0, maxAllreduce = 0;
    int rank = request_.devices - devicesUsed;
    const std::string& forced = request_.options.recompute;
    timings_.clear();
    for (int s = 0; s < count; ++s) {
      const Stage& st = stages_[s];
      if ((forced == "always" && !st.recompute) || (forced == "never" && st.recompute)) return;
      const std::string& zero = request_.options.zero;
      if ((zero == "1" && st.replicas > 1 && !st.zero) || (zero == "0" && st.zero)) return;
      if (model_.microBatchPerReplica(microBatches_, st.replicas) == 0) return;
      const int64_t rows = request_.options.microBatchSize;  // exactly rows x M x r samples
      if (rows > 0 && rows * microBatches_ * st.replicas != request_.batchSize) return;
      if (rank % st.tensorParallel != 0) return;  // a replica's ranks on one node
      StageChoice c{st.first, st.last,       st.replicas, rank, st.recompute, count - 1 - s,
                    st.zero,  st.tensorParallel};
      StageEstimate e = model_.stage(c, microBatches_, schedule_);
      if (e.totalMemoryBytes > model_.memoryLimit()) return;
      sum += e.stageSeconds;
      maxStage = std::max(maxStage, e.stageSeconds);
      maxForward = std::max(maxForward, e.forwardSeconds + e.sendForwardSeconds);
      maxBackward = std::max(maxBackward, e.backwardSeconds + e.sendBackwardSeconds);
      maxAllreduce = std::max(maxAllreduce, e.allreduceSeconds);
      timings_.push_back({e.forwardSeconds, e.sendForwardSeconds, e.backwardSeconds, e.sendBackwardSeconds,
                          e.allreduceSeconds});
      rank += st.replicas * st.tensorParallel;
    }
    // Steady state: 1f1b alternates, so the slowest stage sets the pace; gpipe runs all forwards
    // and then all backwards, each paced by its own slowest stage.
    double period = schedule_ == Schedule::OneFOneB ? maxStage : maxForward + maxBackward;
    best_ = std::min(best_, sum + (microBatches_ - 1) * period + maxAllreduce);
    if (simulate_) {
      const double simulated = simulateTimeline(timings_, microBatches_, schedule_).iterationSeconds;
      if (simulated < bestSimulated_) {
        bestSimulated_ = simulated;
        std::ostringstream text;
        text << "M=" << microBatches_ << " " << scheduleName(schedule_) << ":";
        for (const Stage& st : stages_)
          text << " [" << st.first << ".." << st.last << " r=" << st.replicas
               << (st.recompute ? " rc" : "") << (st.zero ? " z" : "")
               << (st.tensorParallel > 1 ? " tp=" + std::to_string(st.tensorParallel) : "") << "]";
        bestSimulatedPlan_ = text.str();
      }
    }
  }

  const PlanRequest& request_;
  CostModel model_;
  const std::vector<int> tensorParallel_ =
      request_.options.tensorParallelCandidates(request_.devicesPerNode);
  int microBatches_ = 1;
  Schedule schedule_ = Schedule::GPipe;
  std::vector<Stage> stages_;
  double best_ = kNoPlan;
  const bool simulate_;
  std::vector<StageTiming> timings_;
  double bestSimulated_ = kNoPlan;
  std::string bestSimulatedPlan_;
};


// One compared instance of measurePlanQuality.
struct QualityCase {
  int instance = 0;
  const char* stress = "";
  double ratio = 1;            // the planner's plan, simulated, over the best of the space
  double closedFormRatio = 1;  // the closed-form optimum's, the same way
  std::string request, plan, best;
  std::string describe() const {
    std::ostringstream out;
    out << "instance " << instance << " (" << stress << "), ratio " << ratio << "\n"
        << request << "planner: " << plan << "\nexhaustive best: " << best;
    return out.str();
  }
};

struct QualityReport {
  int compared = 0, suboptimal = 0;
  int perStress[4] = {0, 0, 0, 0};
  double worst = 1, worstClosedForm = 1, total = 0;
  double mean() const { return compared ? total / compared : 1; }
  std::string summary() const {
    char text[400];
    std::snprintf(text, sizeof text,
                  "DP plan simulated / exhaustive best simulated on %d small instances (%d plain, "
                  "%d embedding-heavy, %d tight memory, %d many micro-batches): worst %.4f, mean "
                  "%.5f, %d not optimal; the closed-form optimum alone: worst %.4f",
                  compared, perStress[0], perStress[1], perStress[2], perStress[3], worst, mean(),
                  suboptimal, worstClosedForm);
    return text;
  }
};

// Plans `perStress` feasible random instances of each Stress (seeded) with
// planDynamicProgramming (one stage per rank: interleaving is compared in
// interleaved_search_test.cpp) and compares each with the enumeration; `check` sees every case.
inline QualityReport measurePlanQuality(unsigned seed, int perStress,
                                        const std::function<void(const QualityCase&)>& check) {
  std::mt19937 rng(seed);
  const Stress stresses[] = {Stress::kNone, Stress::kEmbeddings, Stress::kTightMemory,
                             Stress::kManyMicroBatches};
  const char* names[] = {"plain", "embeddings", "tight memory", "many micro-batches"};
  QualityReport report;
  for (int instance = 0; instance < 40 * perStress && report.compared < 4 * perStress;
       ++instance) {
    const int stress = instance % 4;
    if (report.perStress[stress] >= perStress) continue;
    const bool many = stresses[stress] == Stress::kManyMicroBatches;
    const int blocks = 2 + static_cast<int>(rng() % (many ? 5 : 7));
    const int devices = 1 + static_cast<int>(rng() % (many ? 4 : 6));
    PlanRequest request = stressedRequest(rng, blocks, devices, stresses[stress]);
    request.options.virtualStages = "1";
    if (instance % 5 == 1) request.options.schedule = "1f1b";
    Exhaustive exhaustive(request, true);
    if (exhaustive.best() == kNoPlan) continue;
    const double best = exhaustive.bestSimulated();
    const Plan plan = planDynamicProgramming(request);
    QualityCase c;
    c.instance = instance;
    c.stress = names[stress];
    c.ratio = simulatePlan(request, plan).iterationSeconds / best;
    c.closedFormRatio =
        simulatePlan(request, searchDynamicProgramming(request).best).iterationSeconds / best;
    c.request = request.toText();
    c.plan = plan.toString();
    c.best = exhaustive.bestSimulatedPlan();
    check(c);
    report.worst = std::max(report.worst, c.ratio);
    report.worstClosedForm = std::max(report.worstClosedForm, c.closedFormRatio);
    report.total += c.ratio;
    report.suboptimal += c.ratio > 1 + 1e-9;
    ++report.perStress[stress];
    ++report.compared;
  }
  return report;
}

}  // namespace autostage::decomposer::testing
