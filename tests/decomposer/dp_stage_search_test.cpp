#include "decomposer/dp_stage_search.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "decomposer/cost_model.h"
#include "random_requests.h"

using namespace autostage;
using namespace autostage::decomposer;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Brute force: every cut set x replica vector (sum <= devices) x recompute vector x micro-batch
// count x schedule, stages laid out on consecutive ranks ending at the last rank (the DP's layout).
// The objective is composed here from CostModel::stage, independently of the DP and evaluator.
class Exhaustive {
 public:
  explicit Exhaustive(const PlanRequest& request) : request_(request), model_(request) {}

  double best() {
    for (int m : request_.options.microBatchCandidates())
      for (Schedule s : request_.options.scheduleCandidates()) {
        microBatches_ = m;
        schedule_ = s;
        chooseStage(0, 0);
      }
    return best_;
  }

 private:
  struct Stage {
    int first, last, replicas;
    bool recompute;
  };

  void chooseStage(int firstBlock, int devicesUsed) {
    const int n = static_cast<int>(request_.blocks.size());
    if (firstBlock == n) return score(devicesUsed);
    for (int last = firstBlock; last < n; ++last)
      for (int r = 1; devicesUsed + r <= request_.devices; ++r)
        for (bool recompute : {false, true}) {
          stages_.push_back({firstBlock, last, r, recompute});
          chooseStage(last + 1, devicesUsed + r);
          stages_.pop_back();
        }
  }

  void score(int devicesUsed) {
    const int count = static_cast<int>(stages_.size());
    if (request_.options.partitionNum > 0 && count != request_.options.partitionNum) return;
    double sum = 0, maxForward = 0, maxBackward = 0, maxStage = 0, maxAllreduce = 0;
    int rank = request_.devices - devicesUsed;
    const std::string& forced = request_.options.recompute;
    for (int s = 0; s < count; ++s) {
      const Stage& st = stages_[s];
      if ((forced == "always" && !st.recompute) || (forced == "never" && st.recompute)) return;
      if (model_.microBatchPerReplica(microBatches_, st.replicas) == 0) return;
      StageChoice c{st.first, st.last, st.replicas, rank, st.recompute, count - 1 - s};
      StageEstimate e = model_.stage(c, microBatches_, schedule_);
      if (e.totalMemoryBytes > model_.memoryLimit()) return;
      sum += e.stageSeconds;
      maxStage = std::max(maxStage, e.stageSeconds);
      maxForward = std::max(maxForward, e.forwardSeconds + e.sendForwardSeconds);
      maxBackward = std::max(maxBackward, e.backwardSeconds + e.sendBackwardSeconds);
      maxAllreduce = std::max(maxAllreduce, e.allreduceSeconds);
      rank += st.replicas;
    }
    // Steady state: 1f1b alternates, so the slowest stage sets the pace; gpipe runs all forwards
    // and then all backwards, each paced by its own slowest stage.
    double period = schedule_ == Schedule::OneFOneB ? maxStage : maxForward + maxBackward;
    best_ = std::min(best_, sum + (microBatches_ - 1) * period + maxAllreduce);
  }

  const PlanRequest& request_;
  CostModel model_;
  int microBatches_ = 1;
  Schedule schedule_ = Schedule::GPipe;
  std::vector<Stage> stages_;
  double best_ = kInf;
};

bool near(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); }

}  // namespace

TEST_CASE("DP search objective equals exhaustive search on 240 random small instances", "[decomposer]") {
  std::mt19937 rng(12345);
  int feasible = 0, infeasible = 0, multiStage = 0;
  for (int instance = 0; instance < 240; ++instance) {
    int blocks = 1 + static_cast<int>(rng() % 10);
    int devices = 1 + static_cast<int>(rng() % 8);
    // Keep the brute force affordable: large block counts go with few devices.
    if (blocks > 6 && devices > 4) devices = 4;
    PlanRequest request = testing::randomRequest(rng, blocks, devices);
    if (instance % 7 == 3) request.options.partitionNum = 1 + static_cast<int>(rng() % std::min(blocks, devices));
    if (instance % 5 == 1) request.options.schedule = "1f1b";
    if (instance % 6 == 2) request.options.recompute = instance % 12 == 2 ? "always" : "never";
    INFO("instance " << instance << "\n" << request.toText());
    double reference = Exhaustive(request).best();
    if (reference == kInf) {
      REQUIRE_THROWS_AS(planDynamicProgramming(request), PlanError);
      ++infeasible;
      continue;
    }
    Plan plan = planDynamicProgramming(request);
    // The DP is exact over the closed form it searches (Note [Search objective and reported
    // estimate] in decomposer/cost_model.h).
    REQUIRE(near(plan.searchSeconds, reference));
    for (const auto& stage : plan.stages) {
      if (request.options.recompute == "always") REQUIRE(stage.recompute);
      if (request.options.recompute == "never") REQUIRE_FALSE(stage.recompute);
    }
    PlanEvaluation evaluation = evaluatePlan(request, plan);
    REQUIRE(evaluation.feasible);
    REQUIRE(near(evaluation.searchSeconds, plan.searchSeconds));
    REQUIRE(near(evaluation.iterationSeconds, plan.predictedSeconds));
    ++feasible;
    multiStage += plan.stages.size() > 1;
  }
  // The instances exercise both outcomes and real pipelines, not only trivial plans.
  REQUIRE(feasible >= 100);
  REQUIRE(infeasible >= 10);
  REQUIRE(multiStage >= 30);
}

TEST_CASE("replica candidates and device units", "[decomposer]") {
  REQUIRE(replicaCandidates(5) == std::vector<int>{1, 2, 3, 4, 5});
  REQUIRE(replicaCandidates(40) == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 40});
  REQUIRE(deviceUnit(64) == 1);
  REQUIRE(deviceUnit(1024) == 16);
}

TEST_CASE("infeasible request names the needed memory and the options", "[decomposer]") {
  std::mt19937 rng(7);
  PlanRequest request = testing::randomRequest(rng, 4, 2);
  request.deviceMemory = 1000;  // bytes: nothing fits
  try {
    planDynamicProgramming(request);
    FAIL("expected PlanError");
  } catch (const PlanError& e) {
    std::string message = e.what();
    REQUIRE(message.find("smallest per-device memory") != std::string::npos);
    REQUIRE(message.find("largest indivisible block") != std::string::npos);
    REQUIRE(message.find("mem_limit_gb") != std::string::npos);
  }
}

TEST_CASE("partition_num above the block or device count says which and what to use", "[decomposer]") {
  std::mt19937 rng(11);
  PlanRequest request = testing::randomRequest(rng, 3, 8);
  request.deviceMemory = 1e18;  // memory is not the reason
  request.options.partitionNum = 4;
  REQUIRE_THROWS_WITH(planDynamicProgramming(request),
                      Catch::Contains("more stages than there are cuttable blocks (3)") &&
                          Catch::Contains("partition_num <= 3"));
  request = testing::randomRequest(rng, 6, 2);
  request.deviceMemory = 1e18;
  request.options.partitionNum = 3;
  REQUIRE_THROWS_WITH(planDynamicProgramming(request),
                      Catch::Contains("more stages than there are devices (2)"));
}
