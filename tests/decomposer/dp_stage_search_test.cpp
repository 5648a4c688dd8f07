#include "decomposer/dp_stage_search.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "decomposer/cost_model.h"
#include "decomposer/planner.h"
#include "decomposer/simulator.h"
#include "plan_quality.h"
#include "random_requests.h"

using namespace autostage;
using namespace autostage::decomposer;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

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
    request.options.virtualStages = "1";  // the one-stage-per-rank space (interleaving:
                                          // interleaved_search_test.cpp)
    if (instance % 7 == 3) request.options.partitionNum = 1 + static_cast<int>(rng() % std::min(blocks, devices));
    if (instance % 5 == 1) request.options.schedule = "1f1b";
    if (instance % 6 == 2) request.options.recompute = instance % 12 == 2 ? "always" : "never";
    if (instance % 4 == 1) request.options.zero = instance % 8 == 1 ? "1" : "0";
    INFO("instance " << instance << "\n" << request.toText());
    double reference = testing::Exhaustive(request).best();
    if (reference == kInf) {
      REQUIRE_THROWS_AS(planDynamicProgramming(request), PlanError);
      ++infeasible;
      continue;
    }
    // The DP is exact over the closed form it searches (Note [Search objective and reported
    // estimate] in decomposer/cost_model.h) ...
    const DpSearchResult search = searchDynamicProgramming(request);
    REQUIRE(near(search.best.searchSeconds, reference));
    // ... and returns the finalist that simulates fastest (Note [Finalists]).
    Plan plan = planDynamicProgramming(request);
    REQUIRE(plan.searchSeconds >= reference * (1 - 1e-9));
    const double simulated = simulatePlan(request, plan).iterationSeconds;
    REQUIRE(simulated <= simulatePlan(request, search.best).iterationSeconds * (1 + 1e-12));
    for (const Plan& finalist : search.finalists)
      REQUIRE(simulated <= simulatePlan(request, finalist).iterationSeconds * (1 + 1e-12));
    for (const auto& stage : plan.stages) {
      if (request.options.recompute == "always") REQUIRE(stage.recompute);
      if (request.options.recompute == "never") REQUIRE_FALSE(stage.recompute);
      if (request.options.zero == "1") REQUIRE(stage.zero == (stage.replicaCount > 1));
      if (request.options.zero == "0" || stage.replicaCount == 1) REQUIRE_FALSE(stage.zero);
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

// Plan quality (Note [Simulated refinement] in decomposer/refine.h, Note [Finalists]): the DP's
// plan, simulated, against the best simulated plan of the whole space on 520 random small
// instances, plain and stressed (plan_quality.h; bench/plan_scaling --quality prints the same
// figures). The closed-form optimum alone is at worst 1.19x; the contract is the planner's plan
// within 2% on every instance and 0.2% on average. A failing instance is printed whole (request
// text and both plans) so that it can be replayed.
TEST_CASE("DP plans simulate within 2% of the exhaustive best simulated plan", "[decomposer]") {
  const testing::QualityReport report = testing::measurePlanQuality(
      4242, 130, [](const testing::QualityCase& c) {
        INFO(c.describe());
        REQUIRE(c.ratio >= 1 - 1e-9);  // the enumeration covers the DP's plan
        REQUIRE(c.ratio <= 1.02);
        REQUIRE(c.ratio <= c.closedFormRatio * (1 + 1e-9));  // never worse than the optimum
      });
  std::printf("%s\n", report.summary().c_str());
  REQUIRE(report.compared >= 500);
  for (int count : report.perStress) REQUIRE(count >= 130);
  REQUIRE(report.mean() <= 1.002);
}

TEST_CASE("replica candidates and device units", "[decomposer]") {
  REQUIRE(replicaCandidates(5) == std::vector<int>{1, 2, 3, 4, 5});
  REQUIRE(replicaCandidates(40) == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 40});
  REQUIRE(deviceUnit(64) == 1);
  REQUIRE(deviceUnit(100) == 2);
  REQUIRE(deviceUnit(1024) == 16);
  REQUIRE(deviceUnit(3072) == 48);  // Note [Tensor-parallel units]: Megatron-LM's stages of 48
  REQUIRE(deviceUnit(2520) == 40);
  for (int devices = 1; devices <= 20000; ++devices) {
    const int unit = deviceUnit(devices);
    REQUIRE(devices / unit <= 64);
    REQUIRE(((unit < 8 && (unit & (unit - 1)) == 0) || unit % 8 == 0));
    const int smaller = unit <= 8 ? unit / 2 : unit - 8;  // the next candidate below
    REQUIRE((unit == 1 || devices / smaller > 64));
    for (int t : {2, 4, 8}) {  // a stage at degree t: whole groups, its first rank a multiple of t
      const StageShape one = stageShape(1, t, unit);
      REQUIRE(one.units * unit == one.replicas * t);
      REQUIRE((unit % t == 0 || t % unit == 0));
    }
  }
  REQUIRE(stageShape(1, 8, deviceUnit(3072)).replicas == 6);
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

TEST_CASE("when every block fits alone, the message says the split is what does not fit",
          "[decomposer]") {
  // Four blocks of 6 GB of parameters, no optimizer state (opt_param_factor 0), on 2 devices of
  // 16 GB (14.4 GB usable): a block alone needs 12 GB (parameters and gradients), two blocks
  // 24 GB, so four blocks fit on no split over two devices.
  PlanRequest request;
  for (int i = 0; i < 4; ++i) {
    BlockCost b;
    b.name = "layer" + std::to_string(i);
    b.forwardSeconds = {1e-3, 1e-4};
    b.backwardSeconds = {2e-3, 2e-4};
    b.activationBytes = {0, 1e3};
    b.cutBytesAfter = {0, 1e3};
    b.paramBytes = 6e9;
    request.blocks.push_back(b);
  }
  request.devices = 2;
  request.devicesPerNode = 2;
  request.deviceMemory = 16e9;
  request.batchSize = 8;
  request.options.optParamFactor = 0;
  try {
    planDynamicProgramming(request);
    FAIL("expected PlanError");
  } catch (const PlanError& e) {
    const std::string message = e.what();
    INFO(message);
    REQUIRE(message.find("Every block fits alone") != std::string::npos);
    REQUIRE(message.find("no split of the 4 blocks into stages fits on 2 devices") !=
            std::string::npos);
    // A batch of 8 within max_pipeline's 32: more micro-batches cannot help, so the message
    // does not ask for them.
    REQUIRE(message.find("even micro-batches of one sample do not fit") != std::string::npos);
    REQUIRE(message.find("raise max_pipeline") == std::string::npos);
    REQUIRE(message.find("tensor_parallel=auto") != std::string::npos);
    REQUIRE(message.find("smallest per-device memory") == std::string::npos);
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

// Note [Plan usage]: a plan for forward()/backward() or for inference runs gpipe (forward only for
// inference); the DP stays exact over each usage's cost model.
TEST_CASE("plans for forward_backward and inference are gpipe and exact against exhaustive search",
          "[decomposer]") {
  std::mt19937 rng(777);
  int feasible[2] = {0, 0};
  for (int instance = 0; instance < 160; ++instance) {
    const int blocks = 1 + static_cast<int>(rng() % 6);
    const int devices = 1 + static_cast<int>(rng() % 4);
    PlanRequest request = testing::randomRequest(rng, blocks, devices);
    const bool inference = instance % 2 == 1;
    request.options.usage = inference ? PlanUsage::Inference : PlanUsage::ForwardBackward;
    INFO("instance " << instance << "\n" << request.toText());
    const double reference = testing::Exhaustive(request).best();
    if (reference == kInf) {
      REQUIRE_THROWS_AS(planDynamicProgramming(request), PlanError);
      continue;
    }
    Plan plan = planDynamicProgramming(request);
    REQUIRE(plan.schedule == Schedule::GPipe);
    REQUIRE(near(searchDynamicProgramming(request).best.searchSeconds, reference));
    PlanEvaluation evaluation = evaluatePlan(request, plan);
    REQUIRE(evaluation.feasible);
    SimulationResult simulated = simulatePlan(request, plan);
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      const StageEstimate& e = evaluation.stages[s];
      // The simulator's peak and the cost model's figure agree (gpipe holds all M micro-batches).
      REQUIRE(simulated.peakMemoryBytes[s] == Approx(e.totalMemoryBytes).epsilon(1e-9));
      if (!inference) continue;
      REQUIRE_FALSE(plan.stages[s].recompute);
      REQUIRE(e.backwardSeconds == 0);
      REQUIRE(e.allreduceSeconds == 0);
      REQUIRE(e.gradientBytes == 0);
      REQUIRE(e.optimizerBytes == 0);
      REQUIRE(e.activationBytes == Approx(plan.microBatchCount * e.outputBytes));
    }
    ++feasible[inference];
  }
  REQUIRE(feasible[0] >= 30);
  REQUIRE(feasible[1] >= 30);
}

TEST_CASE("an inference plan fits where no training plan does", "[decomposer]") {
  std::mt19937 rng(4242);
  int found = 0;
  for (int instance = 0; instance < 400 && found < 10; ++instance) {
    PlanRequest request = testing::randomRequest(rng, 1 + static_cast<int>(rng() % 5), 2);
    request.options.optParamFactor = 2;
    request.options.usage = PlanUsage::ForwardBackward;
    if (testing::Exhaustive(request).best() != kInf) continue;
    request.options.usage = PlanUsage::Inference;
    if (testing::Exhaustive(request).best() == kInf) continue;
    INFO(request.toText());
    REQUIRE(planDynamicProgramming(request).schedule == Schedule::GPipe);
    ++found;
  }
  REQUIRE(found >= 3);
}

// Note [ZeRO-1 cost]: ZeRO-1 costs no time and saves optimizer memory, so with zero=auto the DP
// picks it exactly where a plan would not fit otherwise, and matches the exhaustive search.
TEST_CASE("zero=auto picks ZeRO-1 only where it makes the plan fit", "[decomposer]") {
  std::mt19937 rng(1919);
  int onlyWithZero = 0, fitsWithout = 0;
  for (int instance = 0; instance < 600 && onlyWithZero < 10; ++instance) {
    PlanRequest request =
        testing::randomRequest(rng, 1 + static_cast<int>(rng() % 5), 2 + static_cast<int>(rng() % 3));
    request.options.optParamFactor = 2;
    request.options.zero = "0";
    const double without = testing::Exhaustive(request).best();
    request.options.zero = "auto";
    const double with = testing::Exhaustive(request).best();
    INFO("instance " << instance << "\n" << request.toText());
    if (with == kInf) continue;
    const Plan plan = planDynamicProgramming(request);
    REQUIRE(near(searchDynamicProgramming(request).best.searchSeconds, with));
    REQUIRE(with <= without);
    if (without == kInf) {
      // Only ZeRO-1 fits: some replicated stage shards, and the plan evaluates as feasible.
      REQUIRE(std::any_of(plan.stages.begin(), plan.stages.end(),
                          [](const StagePlan& s) { return s.zero && s.replicaCount > 1; }));
      REQUIRE(evaluatePlan(request, plan).feasible);
      // The partition log says which stage shards.
      {
        core::LogCapture capture(/*echo=*/false);
        logPlan(request, plan, evaluatePlan(request, plan));
        const auto& lines = capture.lines();
        REQUIRE(std::any_of(lines.begin(), lines.end(), [](const std::string& line) {
          return line.find("[DPStaging] [info] graph=STAGE_") != std::string::npos &&
                 line.find(" zero=1 ") != std::string::npos;
        }));
      }
      request.options.zero = "0";
      REQUIRE_THROWS_AS(planDynamicProgramming(request), PlanError);
      ++onlyWithZero;
    } else if (near(with, without)) {
      ++fitsWithout;
    }
  }
  REQUIRE(onlyWithZero >= 3);
  REQUIRE(fitsWithout >= 3);
}

TEST_CASE("ZeRO-1 divides a replicated stage's optimizer bytes by its replica count",
          "[decomposer]") {
  std::mt19937 rng(77);
  PlanRequest request = testing::randomRequest(rng, 3, 4);
  request.options.optParamFactor = 2;
  CostModel model(request);
  StageChoice plain{0, 2, 4, 0, false, 0, false}, sharded{0, 2, 4, 0, false, 0, true};
  StageEstimate a = model.stage(plain, 1, Schedule::GPipe), b = model.stage(sharded, 1, Schedule::GPipe);
  REQUIRE(b.optimizerBytes == Approx(a.optimizerBytes / 4));
  REQUIRE(b.totalMemoryBytes == Approx(a.totalMemoryBytes - a.optimizerBytes * 3 / 4));
  REQUIRE(b.allreduceSeconds == a.allreduceSeconds);
  REQUIRE(b.stageSeconds == a.stageSeconds);
  StageChoice single{0, 2, 1, 0, false, 0, true};
  REQUIRE(model.stage(single, 1, Schedule::GPipe).optimizerBytes == Approx(a.optimizerBytes));
  PlanOptions options;
  options.zero = "sometimes";
  REQUIRE_THROWS_WITH(options.validate(), Catch::Contains("zero='sometimes'"));
  options.zero = "1";
  REQUIRE(options.zeroCandidates() == std::vector<bool>{true});
  options.usage = PlanUsage::Inference;
  REQUIRE(options.zeroCandidates() == std::vector<bool>{false});
}

TEST_CASE("schedule=1f1b cannot be planned for forward()/backward()", "[decomposer]") {
  PlanOptions options;
  options.schedule = "1f1b";
  options.usage = PlanUsage::ForwardBackward;
  REQUIRE_THROWS_WITH(options.validate(), Catch::Contains("train_step") &&
                                              Catch::Contains("schedule=gpipe or auto"));
  options.usage = PlanUsage::TrainStep;
  REQUIRE_NOTHROW(options.validate());
  REQUIRE(options.scheduleCandidates() == std::vector<Schedule>{Schedule::OneFOneB});
  options.schedule = "auto";
  options.usage = PlanUsage::ForwardBackward;
  REQUIRE(options.scheduleCandidates() == std::vector<Schedule>{Schedule::GPipe});
  options.usage = PlanUsage::Inference;
  REQUIRE(options.recomputeCandidates() == std::vector<bool>{false});
}

TEST_CASE("with micro_batch_size the DP equals exhaustive search over the plans of that size",
          "[decomposer]") {
  // Note [Fixed micro-batch size]: every stage's micro-batches have exactly that many rows.
  std::mt19937 rng(777);
  int feasible = 0, infeasible = 0;
  for (int instance = 0; instance < 120; ++instance) {
    const int blocks = 1 + static_cast<int>(rng() % 6);
    const int devices = 1 + static_cast<int>(rng() % 6);
    PlanRequest request = testing::randomRequest(rng, blocks, devices);
    request.options.virtualStages = "1";
    request.options.microBatchSize = 1 + static_cast<int>(rng() % 4);
    request.batchSize = request.options.microBatchSize * (1 + static_cast<int>(rng() % 8));
    INFO("instance " << instance << "\n" << request.toText());
    const double reference = testing::Exhaustive(request).best();
    if (reference == kInf) {
      REQUIRE_THROWS_AS(planDynamicProgramming(request), PlanError);
      ++infeasible;
      continue;
    }
    ++feasible;
    REQUIRE(near(searchDynamicProgramming(request).best.searchSeconds, reference));
    const Plan plan = planDynamicProgramming(request);
    REQUIRE(evaluatePlan(request, plan).feasible);
    for (const StagePlan& s : plan.stages)
      REQUIRE(request.options.microBatchSize * plan.microBatchCount * s.replicaCount ==
              request.batchSize);
  }
  REQUIRE(feasible >= 40);
  REQUIRE(infeasible >= 5);
  // A size the batch cannot be split into: the message names it.
  PlanRequest request = testing::randomRequest(rng, 3, 4);
  request.batchSize = 10;
  request.options.microBatchSize = 3;
  REQUIRE_THROWS_WITH(planDynamicProgramming(request),
                      Catch::Contains("micro_batch_size=3 cannot divide the batch 10"));
}
