// Pipeline estimates against the simulator (Note [1f1b pipeline estimate]), and the schedule
// choice of schedule=auto (Note [Schedule choice]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "decomposer/baselines.h"
#include "decomposer/dp_stage_search.h"
#include "decomposer/pipeline_time.h"
#include "estimate_check.h"
#include "random_requests.h"

using namespace autostage;
using namespace autostage::decomposer;

namespace {

using Planner = Plan (*)(const PlanRequest&);

// Plans `request` with `planner`; false when nothing fits.
bool tryPlan(Planner planner, const PlanRequest& request, Plan* plan) {
  try {
    *plan = planner(request);
    return true;
  } catch (const PlanError&) {
    return false;
  }
}

// The DP's plan with the smallest searched objective (before the choice among its finalists).
Plan searchedBest(const PlanRequest& request) { return searchDynamicProgramming(request).best; }

// A random plan: random cuts, replica counts and recompute flags, ignoring memory.
Plan randomPlan(std::mt19937& rng, const PlanRequest& request, int microBatches) {
  const int blocks = static_cast<int>(request.blocks.size());
  const int stages = 1 + static_cast<int>(rng() % std::min(blocks, request.devices));
  std::vector<int> cuts;
  for (int b = 1; b < blocks; ++b) cuts.push_back(b);
  std::shuffle(cuts.begin(), cuts.end(), rng);
  cuts.resize(stages - 1);
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(blocks);
  Plan plan;
  plan.microBatchCount = microBatches;
  plan.schedule = rng() % 2 ? Schedule::OneFOneB : Schedule::GPipe;
  int rank = 0, first = 0;
  for (int s = 0; s < stages; ++s) {
    const int spare = request.devices - rank - (stages - s);
    int replicas = 1 + (spare > 0 && rng() % 2 ? static_cast<int>(rng() % (spare + 1)) : 0);
    while (replicas > 1 && static_cast<int64_t>(replicas) * microBatches > request.batchSize) --replicas;
    plan.stages.push_back({first, cuts[s] - 1, replicas, rank, rng() % 3 == 0});
    rank += replicas;
    first = cuts[s];
  }
  return plan;
}

}  // namespace

TEST_CASE("estimates against the simulator on every plan the planners produce", "[decomposer]") {
  std::mt19937 rng(2024);
  testing::gapRecord() = {};
  const std::vector<Planner> planners{planDynamicProgramming, planUniform, planParamBalanced, planDataParallel};
  int multiStage = 0;
  for (int instance = 0; instance < 120; ++instance) {
    PlanRequest request = testing::randomRequest(rng, 2 + static_cast<int>(rng() % 11), 1 + static_cast<int>(rng() % 16));
    request.options.maxPipeline = 16;
    request.options.schedule = std::vector<std::string>{"auto", "gpipe", "1f1b"}[instance % 3];
    request.options.recompute = std::vector<std::string>{"auto", "always", "never"}[instance / 3 % 3];
    if (instance % 4 == 1) request.options.pipelineNum = 2 << (rng() % 3);  // 2, 4 or 8
    INFO("instance " << instance << "\n" << request.toText());
    for (Planner planner : planners) {
      Plan plan;
      if (!tryPlan(planner, request, &plan)) continue;
      testing::requireEstimateMatchesSimulation(request, plan);
      multiStage += plan.stages.size() > 1;
    }
  }
  const testing::GapRecord& record = testing::gapRecord();
  std::printf("estimate vs simulator on %d gpipe / %d 1f1b planner outputs: reported estimate gpipe %.4f "
              "1f1b %.4f; search objective (closed form) gpipe %.4f 1f1b %.4f\n", record.plans[0],
              record.plans[1], record.planner[0], record.planner[1], record.search[0], record.search[1]);
  // The reported estimate is held to 5% per plan above; the closed form the planners search is
  // not (measured up to ~18% on these plans), which is why it is not what they report.
  REQUIRE(record.planner[1] <= 0.05);
  REQUIRE(record.planner[1] < record.search[1]);
  REQUIRE(record.plans[0] >= 50);
  REQUIRE(record.plans[1] >= 100);
  REQUIRE(multiStage >= 100);
}

TEST_CASE("on arbitrary uneven plans the estimate is a lower bound of the simulated schedule", "[decomposer]") {
  std::mt19937 rng(77);
  double worst[2] = {0, 0};
  for (int instance = 0; instance < 400; ++instance) {
    PlanRequest request = testing::randomRequest(rng, 2 + static_cast<int>(rng() % 11), 2 + static_cast<int>(rng() % 15));
    request.deviceMemory = 1e18;  // memory is not the point here
    request.batchSize = 64;
    Plan plan = randomPlan(rng, request, 2 << (rng() % 3));
    INFO(request.toText());
    // Not planner outputs: the uneven stages a planner avoids widen the gap; on these plans
    // (at most 12 stages) it stays within 5% too, on arbitrary longer ones it need not (Note).
    const double gap = testing::requireEstimateMatchesSimulation(request, plan, 0.05);
    double& slot = worst[plan.schedule == Schedule::OneFOneB];
    slot = std::max(slot, gap);
  }
  std::printf("estimate vs simulator, arbitrary plans: gpipe max gap %.4f, 1f1b max gap %.4f\n", worst[0], worst[1]);
  REQUIRE(worst[0] <= 1e-9);  // gpipe's closed form is exact
}

TEST_CASE("worked example of the 1f1b pipeline estimate Note", "[decomposer]") {
  // f = b = 3 ms on stage 0, 1 ms on stage 1, two micro-batches: the schedule takes 12 ms, the
  // closed form sum + (M - 1) max says 14 ms.
  std::vector<StageTimes> stages{{3e-3, 3e-3}, {1e-3, 1e-3}};
  REQUIRE(testing::referencePipelineSeconds(stages, 2, Schedule::OneFOneB) == Approx(12e-3));
  REQUIRE(estimatePipelineSeconds(stages, 2, Schedule::OneFOneB) == Approx(12e-3));
  PlanRequest request;
  request.devices = request.devicesPerNode = 2;
  request.batchSize = 2;
  request.deviceMemory = 1e12;
  request.comm.p2pIntraNode = request.comm.p2pInterNode = {0, 1e30};
  for (double seconds : {3e-3, 1e-3}) {
    BlockCost c;
    c.forwardSeconds = c.backwardSeconds = {seconds, 0};
    request.blocks.push_back(c);
  }
  Plan plan;
  plan.microBatchCount = 2;
  plan.schedule = Schedule::OneFOneB;
  plan.stages = {{0, 0, 1, 0, false}, {1, 1, 1, 1, false}};
  // The planner searches the closed form and reports the tight estimate.
  REQUIRE(evaluatePlan(request, plan).searchSeconds == Approx(14e-3));
  REQUIRE(evaluatePlan(request, plan).iterationSeconds == Approx(12e-3));
  REQUIRE(simulatePlan(request, plan).iterationSeconds == Approx(12e-3));
  // gpipe: forwards 3 + 1 + 3, then backwards 1 + 3 + 3.
  REQUIRE(testing::referencePipelineSeconds(stages, 2, Schedule::GPipe) == Approx(14e-3));
  REQUIRE(estimatePipelineSeconds(stages, 2, Schedule::GPipe) == Approx(14e-3));
}

// Note [Schedule choice]: in the planner's model gpipe never beats 1f1b, so auto searches 1f1b;
// check that this gives the better of the two forced searches.
TEST_CASE("schedule=auto returns the better of gpipe and 1f1b", "[decomposer]") {
  std::mt19937 rng(31);
  int compared = 0;
  for (int instance = 0; instance < 60; ++instance) {
    PlanRequest request = testing::randomRequest(rng, 2 + static_cast<int>(rng() % 8), 1 + static_cast<int>(rng() % 8));
    Plan automatic, gpipe, oneFOneB;
    if (!tryPlan(searchedBest, request, &automatic)) continue;
    request.options.schedule = "gpipe";
    const bool gpipeFits = tryPlan(searchedBest, request, &gpipe);
    request.options.schedule = "1f1b";
    REQUIRE(tryPlan(searchedBest, request, &oneFOneB));  // holds no more than gpipe
    double best = oneFOneB.searchSeconds;  // the searched objective
    if (gpipeFits) best = std::min(best, gpipe.searchSeconds);
    REQUIRE(automatic.searchSeconds == Approx(best).epsilon(1e-12));
    ++compared;
  }
  REQUIRE(compared >= 30);
}

TEST_CASE("1f1b wins when memory limits the micro-batches held and gpipe at most ties", "[decomposer]") {
  // Four equal blocks of 4 GB parameters on four devices, each device fitting one block's
  // parameters, gradients and Adam state plus 4.5 GB of activations; the batch's activations are
  // 6.4 GB per block. gpipe holds the whole batch, so it only fits by recomputing; 1f1b holds at
  // most 4 micro-batches, which fits without recomputation from 8 micro-batches on.
  PlanRequest request;
  request.devices = request.devicesPerNode = 4;
  request.batchSize = 32;
  request.comm.p2pIntraNode = request.comm.p2pInterNode = {1e-6, 1e11};
  request.comm.allreduceIntraNode = request.comm.allreduceInterNode = {1e-5, 1e11};
  for (int b = 0; b < 4; ++b) {
    BlockCost c;
    c.forwardSeconds = {1e-4, 1e-3};
    c.backwardSeconds = {2e-4, 2e-3};
    c.activationBytes = {0, 2e8};
    c.cutBytesAfter = {0, 1e6};
    c.paramBytes = 4e9;
    request.blocks.push_back(c);
  }
  request.deviceMemory = 16e9 + 4.5e9;
  request.options.memMargin = 0;
  request.options.schedule = "gpipe";
  request.options.recompute = "never";
  REQUIRE_THROWS_AS(planDynamicProgramming(request), PlanError);
  request.options.recompute = "auto";
  Plan gpipe = planDynamicProgramming(request);
  REQUIRE(std::all_of(gpipe.stages.begin(), gpipe.stages.end(), [](const StagePlan& s) { return s.recompute; }));
  request.options.schedule = "auto";
  Plan automatic = planDynamicProgramming(request);
  INFO(gpipe.toString() << "\n" << automatic.toString());
  REQUIRE(automatic.schedule == Schedule::OneFOneB);
  REQUIRE(automatic.microBatchCount >= 8);
  REQUIRE(std::none_of(automatic.stages.begin(), automatic.stages.end(), [](const StagePlan& s) { return s.recompute; }));
  REQUIRE(automatic.predictedSeconds < 0.85 * gpipe.predictedSeconds);
  testing::requireEstimateMatchesSimulation(request, automatic);
  testing::requireEstimateMatchesSimulation(request, gpipe);
  // With memory to spare gpipe can at best tie: on the same plan its schedule is never shorter.
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    std::vector<StageTimes> stages(1 + rng() % 6);
    for (StageTimes& s : stages) s = {1e-3 * (1 + rng() % 20), 1e-3 * (1 + rng() % 20)};
    const int m = 1 << (rng() % 5);
    REQUIRE(testing::referencePipelineSeconds(stages, m, Schedule::OneFOneB) <=
            testing::referencePipelineSeconds(stages, m, Schedule::GPipe) * (1 + 1e-12));
  }
}
