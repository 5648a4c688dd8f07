// Tensor parallelism in the planner (Note [Tensor-parallel cost] in decomposer/cost_model.h): the
// cost model's formulas, the plan shape rules, the options, the DP against the exhaustive search
// over the same space, and a layer too large for one device.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "core/error.h"
#include "decomposer/baselines.h"
#include "decomposer/cost_model.h"
#include "decomposer/dp_bounds.h"
#include "decomposer/dp_stage_search.h"
#include "decomposer/request_merge.h"
#include "plan_quality.h"
#include "random_requests.h"

using namespace autostage;
using namespace autostage::decomposer;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool near(double a, double b) {
  return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
}

// Marks a random share of the blocks' costs as shardable spans, as a transformer layer's linear
// and attention operations would be (most of the time and parameters, one or two pairs); a third
// of the spans cover two blocks (a pattern a block boundary cuts).
void addShardableParts(std::mt19937& rng, PlanRequest& request) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto between = [&](double lo, double hi) { return lo + (hi - lo) * unit(rng); };
  const int n = static_cast<int>(request.blocks.size());
  for (int first = 0; first < n; ++first) {
    if (unit(rng) < 0.25) continue;  // a block with nothing shardable (an embedding, a loss)
    const int last = first + 1 < n && unit(rng) < 0.33 ? first + 1 : first;
    const double share = between(0.5, 0.95);
    ShardableSpan span{first, last, {}};
    ShardableCost& s = span.cost;
    for (int b = first; b <= last; ++b) {
      const BlockCost& c = request.blocks[b];
      s.forwardSeconds.fixed += c.forwardSeconds.fixed * share;
      s.forwardSeconds.perSample += c.forwardSeconds.perSample * share;
      s.backwardSeconds.fixed += c.backwardSeconds.fixed * share;
      s.backwardSeconds.perSample += c.backwardSeconds.perSample * share;
      s.activationBytes.fixed += c.activationBytes.fixed * share;
      s.activationBytes.perSample += c.activationBytes.perSample * share;
      s.paramBytes += c.paramBytes * between(0.8, 1.0);
    }
    s.allreducePairs = 1 + static_cast<int>(rng() % 2);
    s.allreduceBytes = {0, s.allreducePairs * between(1e5, 2e7)};
    // A fifth of the patterns do not split at 8 or at 4 and 8 (12 heads; a vocabulary of 50,257
    // rows splits at none): ShardableSpan::degrees.
    const double d = unit(rng);
    if (d < 0.1) span.degrees = 1u << 2;
    else if (d < 0.2) span.degrees = (1u << 2) | (1u << 4);
    // Half the patterns measured on a member at some degrees (Note [Tensor-parallel profile]):
    // between the whole / t and the whole (a small split runs the cores less well).
    for (int t : {2, 4, 8}) {
      if (unit(rng) < 0.5) continue;
      auto part = [&](const core::LinearCost& whole) {
        const double f = between(1.0 / t, 1.0);
        return core::LinearCost{whole.fixed * f, whole.perSample * f};
      };
      span.measured[ShardableSpan::slot(t)] =
          ShardableSpan::MemberTimes{part(s.forwardSeconds), part(s.backwardSeconds)};
    }
    request.shardable.push_back(span);
    // The groups outside the pattern need part of the blocks' working bytes, or none.
    for (int b = first; b <= last; ++b) {
      BlockCost& c = request.blocks[b];
      const double outside = unit(rng) < 0.2 ? 0.0 : between(0.1, 1.0);
      c.replicatedWorkingBytes =
          core::LinearCost{c.workingBytes.fixed * outside, c.workingBytes.perSample * outside};
    }
    first = last;
  }
}

// One block of 100 MB of parameters, 80 MB of them shardable, on 4 devices of one node.
PlanRequest oneLayer() {
  PlanRequest r;
  BlockCost b;
  b.name = "layer";
  b.forwardSeconds = {1e-3, 1e-4};
  b.backwardSeconds = {2e-3, 2e-4};
  b.activationBytes = {0, 1e6};
  b.workingBytes = {1e3, 1e2};
  b.paramBytes = 1e8;
  const ShardableCost layer{{8e-4, 8e-5}, {1.6e-3, 1.6e-4}, {0, 6e5}, 8e7, 2, {0, 4e5}};
  r.shardable = {{0, 0, layer}, {1, 1, layer}};
  r.blocks = {b, b};
  r.blocks[0].cutBytesAfter = {0, 1e5};
  r.devices = 4;
  r.devicesPerNode = 4;
  r.deviceMemory = 1e10;
  r.batchSize = 16;
  r.options.tensorParallel = "auto";
  r.comm.allreduceIntraNode = {1e-5, 1e11};
  r.comm.allreduceInterNode = {5e-5, 1e10};
  r.comm.p2pIntraNode = {1e-6, 1e11};
  r.comm.p2pInterNode = {1e-5, 1e10};
  return r;
}

}  // namespace

TEST_CASE("tensor-parallel stage estimate follows Note [Tensor-parallel cost]", "[decomposer]") {
  const PlanRequest request = oneLayer();
  const CostModel model(request);
  const StageChoice whole{0, 0, 1, 0, false, 1, false, 1};
  StageChoice split = whole;
  split.tensorParallel = 2;
  split.replicaCount = 2;  // ranks 0..3: two replicas of two ranks
  const StageEstimate one = model.stage(whole, 4, Schedule::OneFOneB);
  const StageEstimate two = model.stage(split, 4, Schedule::OneFOneB);
  const double mb = 16.0 / (4 * 2);
  REQUIRE(two.microBatchPerReplica == 2);
  // All-reduces: 2 pairs, ring over 2 ranks of one node: 2 lat + 2 (1/2) bytes / bw.
  const double allreduce = 2 * 1e-5 + 1.0 * (4e5 * mb) / 1e11;
  REQUIRE(near(two.tensorParallelForwardSeconds, allreduce));
  REQUIRE(near(two.tensorParallelBackwardSeconds, allreduce));
  REQUIRE(near(two.forwardSeconds,
               (1e-3 - 8e-4) + (1e-4 - 8e-5) * mb + (8e-4 + 8e-5 * mb) / 2 + allreduce));
  REQUIRE(near(two.backwardSeconds,
               (2e-3 - 1.6e-3) + (2e-4 - 1.6e-4) * mb + (1.6e-3 + 1.6e-4 * mb) / 2 + allreduce));
  const double params = 2e7 + 8e7 / 2;
  REQUIRE(near(two.paramBytes, params));
  REQUIRE(near(two.gradientBytes, params));
  REQUIRE(near(two.optimizerBytes, 2 * params));
  // Activations per held micro-batch: the unsharded 0.4 MB/sample whole, the 0.6 MB/sample halved.
  REQUIRE(near(two.bytesPerHeldMicroBatch, (4e5 + 6e5 / 2) * mb));
  // Data-parallel gradient allreduce over the 2 replicas of each shard, all 4 ranks on one node.
  REQUIRE(near(two.allreduceSeconds, 1e-5 + 1.0 * params / 1e11));
  // Degree 1 is the estimate without tensor parallelism: no all-reduce, nothing divided.
  REQUIRE(one.tensorParallelForwardSeconds == 0);
  REQUIRE(one.paramBytes == 1e8);
  REQUIRE(one.forwardSeconds == 1e-3 + 1e-4 * 16.0 / 4);
}

TEST_CASE("a tensor-parallel group's all-reduces are costed on its group size's measured link",
          "[decomposer]") {
  PlanRequest request = oneLayer();
  request.comm.allreduceGroups[2] = {4e-5, 2e10};  // 2 of the node's 4 ranks: slower here
  const CostModel model(request);
  StageChoice split{0, 0, 2, 0, false, 1, false, 2};
  const double mb = 16.0 / (4 * 2);
  REQUIRE(near(model.stage(split, 4, Schedule::OneFOneB).tensorParallelForwardSeconds,
               2 * 4e-5 + 1.0 * (4e5 * mb) / 2e10));
  // Degree 4 spans the node: no group entry for 4, the node's all-reduce.
  split.tensorParallel = 4;
  split.replicaCount = 1;
  REQUIRE(near(model.stage(split, 4, Schedule::OneFOneB).tensorParallelForwardSeconds,
               2 * 1e-5 + 1.5 * (4e5 * 16.0 / 4) / 1e11));
  // The group links survive the request's text form.
  const PlanRequest back = PlanRequest::parse(request.toText());
  REQUIRE(back.comm.allreduceGroups == request.comm.allreduceGroups);
  REQUIRE_THROWS_AS(PlanRequest::parse(request.toText() + "comm_group 1 1e-5 1e9\n"), FormatError);
}

TEST_CASE("a tensor-parallel group across nodes is costed on the inter-node link", "[decomposer]") {
  PlanRequest request = oneLayer();
  request.devicesPerNode = 1;
  const CostModel model(request);
  const StageEstimate e = model.stage({0, 0, 1, 0, false, 1, false, 2}, 1, Schedule::OneFOneB);
  REQUIRE(near(e.tensorParallelForwardSeconds, 2 * 5e-5 + 1.0 * (4e5 * 16) / 1e10));
}

TEST_CASE("a tensor-parallel stage's working bytes split where its patterns do", "[decomposer]") {
  // Note [Tensor-parallel working memory], against the rule applied block by block: a block
  // holding a pattern's group counts max(replicated, working / t) when every span reaching it
  // lies within the stage and splits at t, else its working bytes whole.
  std::mt19937 rng(2031);
  int split = 0;
  for (int instance = 0; instance < 40; ++instance) {
    const int n = 2 + static_cast<int>(rng() % 7);
    PlanRequest request = testing::randomRequest(rng, n, 8);
    request.devicesPerNode = 8;
    request.options.tensorParallel = "auto";
    addShardableParts(rng, request);
    for (ShardableSpan& s : request.shardable)  // longer spans than addShardableParts makes
      if (rng() % 4 == 0) s.firstBlock = std::max(0, s.firstBlock - 2);
    std::stable_sort(request.shardable.begin(), request.shardable.end(),
                     [](const ShardableSpan& a, const ShardableSpan& b) { return a.lastBlock < b.lastBlock; });
    INFO("instance " << instance << "\n" << request.toText());
    const RangeIndex ranges(request);
    for (int t : {2, 4, 8})
      for (int first = 0; first < n; ++first)
        for (int last = first; last < n; ++last) {
          core::LinearCost expected;
          for (int b = first; b <= last; ++b) {
            const BlockCost& c = request.blocks[b];
            bool whole = !c.replicatedWorkingBytes;
            for (const ShardableSpan& s : request.shardable)
              if (s.firstBlock <= b && b <= s.lastBlock)
                whole = whole || s.firstBlock < first || s.lastBlock > last || !s.splitsAt(t);
            core::LinearCost w = c.workingBytes;
            if (!whole) {
              w = {std::max(c.replicatedWorkingBytes->fixed, w.fixed / t),
                   std::max(c.replicatedWorkingBytes->perSample, w.perSample / t)};
              split += w.fixed < c.workingBytes.fixed;
            }
            expected.fixed = std::max(expected.fixed, w.fixed);
            expected.perSample = std::max(expected.perSample, w.perSample);
          }
          const core::LinearCost got = ranges.workingAt(first, last, t, false);
          CHECK(got.fixed == expected.fixed);
          CHECK(got.perSample == expected.perSample);
          // The bound for the stops: below every extension to the left.
          const core::LinearCost low = ranges.workingAt(first, last, t, true);
          for (int f = first; f >= 0; --f) {
            const core::LinearCost wider = ranges.workingAt(f, last, t, false);
            CHECK(low.fixed <= wider.fixed);
            CHECK(low.perSample <= wider.perSample);
          }
        }
  }
  CHECK(split > 50);  // the instances do split working bytes
  // And the stage estimate uses it: the one-layer request's block, its groups outside the
  // pattern needing 40% of its working bytes, at degree 4.
  PlanRequest request = oneLayer();
  request.blocks[0].replicatedWorkingBytes = core::LinearCost{400, 40};
  const CostModel model(request);
  const StageChoice choice{0, 0, 1, 0, false, 1, false, 4};
  const StageEstimate e = model.stage(choice, 4, Schedule::OneFOneB);
  CHECK(e.workingBytes == std::max(400.0, 1e3 / 4) + std::max(40.0, 1e2 / 4) * 4);
  // Text form: the field survives, and a block without it reads back without it.
  const PlanRequest back = PlanRequest::parse(request.toText());
  REQUIRE(back.blocks[0].replicatedWorkingBytes.has_value());
  CHECK(back.blocks[0].replicatedWorkingBytes->fixed == 400);
  CHECK(back.blocks[0].replicatedWorkingBytes->perSample == 40);
  CHECK_FALSE(back.blocks[1].replicatedWorkingBytes.has_value());
  // A bad field is named, and so are bytes outside the patterns above the block's own.
  std::string text = request.toText();  // block 1 has none: a field after its parameters
  const size_t end = text.find('\n', text.find("\nblock ", text.find("\nblock ") + 1) + 1);
  REQUIRE_THROWS_WITH(PlanRequest::parse(text.substr(0, end) + " x" + text.substr(end)),
                      Catch::Contains("missing or bad field"));
  request.blocks[0].replicatedWorkingBytes = core::LinearCost{2e3, 40};
  REQUIRE_THROWS_WITH(request.validate(), Catch::Contains("block 0's working bytes outside"));
}

TEST_CASE("merged blocks keep the working bytes outside their patterns", "[decomposer]") {
  // request_merge.h (the DP's coarser levels): a merged block holding a pattern's group keeps,
  // as replicatedWorkingBytes, the largest of its blocks' bytes outside every pattern (a block
  // without a pattern's group: all of its working bytes).
  std::mt19937 rng(2032);
  for (int instance = 0; instance < 20; ++instance) {
    PlanRequest request = testing::randomRequest(rng, 6 + static_cast<int>(rng() % 6), 8);
    request.options.tensorParallel = "auto";
    addShardableParts(rng, request);
    const MergedRequest merged = mergeRequestBlocks(request, 3);
    REQUIRE(merged.request.blocks.size() + 1 == merged.firstBlock.size());
    for (size_t k = 0; k + 1 < merged.firstBlock.size(); ++k) {
      std::optional<core::LinearCost> expected;
      bool any = false;
      core::LinearCost outside;
      for (int b = merged.firstBlock[k]; b < merged.firstBlock[k + 1]; ++b) {
        const BlockCost& c = request.blocks[b];
        any = any || c.replicatedWorkingBytes.has_value();
        const core::LinearCost own = c.replicatedWorkingBytes.value_or(c.workingBytes);
        outside = {std::max(outside.fixed, own.fixed), std::max(outside.perSample, own.perSample)};
      }
      if (any) expected = outside;
      const BlockCost& got = merged.request.blocks[k];
      REQUIRE(got.replicatedWorkingBytes.has_value() == expected.has_value());
      if (expected) {
        CHECK(got.replicatedWorkingBytes->fixed == expected->fixed);
        CHECK(got.replicatedWorkingBytes->perSample == expected->perSample);
      }
    }
  }
}

TEST_CASE("tensor_parallel=1 plans exactly as a request with nothing shardable", "[decomposer]") {
  std::mt19937 rng(2030);
  int compared = 0;
  for (int instance = 0; instance < 60; ++instance) {
    PlanRequest plain = testing::randomRequest(rng, 2 + static_cast<int>(rng() % 6),
                                               1 + static_cast<int>(rng() % 8));
    PlanRequest marked = plain;
    addShardableParts(rng, marked);
    INFO("instance " << instance << "\n" << plain.toText());
    Plan expected, got;
    try {
      expected = planDynamicProgramming(plain);
    } catch (const PlanError&) {
      REQUIRE_THROWS_AS(planDynamicProgramming(marked), PlanError);
      continue;
    }
    got = planDynamicProgramming(marked);
    REQUIRE(got.stages == expected.stages);
    REQUIRE(got.microBatchCount == expected.microBatchCount);
    REQUIRE(got.schedule == expected.schedule);
    REQUIRE(got.virtualStages == expected.virtualStages);
    REQUIRE(got.predictedSeconds == expected.predictedSeconds);
    REQUIRE(got.searchSeconds == expected.searchSeconds);
    ++compared;
  }
  REQUIRE(compared >= 20);
}

TEST_CASE("DP with tensor_parallel=auto equals exhaustive search over the same space",
          "[decomposer]") {
  std::mt19937 rng(30);
  int feasible = 0, infeasible = 0, sharded = 0;
  for (int instance = 0; instance < 160; ++instance) {
    const int blocks = 1 + static_cast<int>(rng() % 5);
    const int devices = 1 + static_cast<int>(rng() % 8);
    PlanRequest request = testing::randomRequest(rng, blocks, devices);
    request.devicesPerNode = std::vector<int>{2, 4, 8}[rng() % 3];
    request.options.virtualStages = "1";
    request.options.tensorParallel = instance % 5 == 4 ? "2" : "auto";
    if (request.devicesPerNode % 2 != 0) request.options.tensorParallel = "auto";
    if (instance % 4 == 1) request.options.schedule = "1f1b";
    if (instance % 6 == 2) request.options.recompute = "never";
    if (instance % 7 == 3) request.options.partitionNum = 1 + static_cast<int>(rng() % blocks);
    addShardableParts(rng, request);
    INFO("instance " << instance << " tensor_parallel=" << request.options.tensorParallel << "\n"
                     << request.toText());
    const double reference = testing::Exhaustive(request).best();
    if (reference == kInf) {
      REQUIRE_THROWS_AS(planDynamicProgramming(request), PlanError);
      ++infeasible;
      continue;
    }
    const DpSearchResult search = searchDynamicProgramming(request);
    INFO("DP plan " << search.best.toString());
    REQUIRE(near(search.best.searchSeconds, reference));
    const Plan plan = planDynamicProgramming(request);
    const PlanEvaluation e = evaluatePlan(request, plan);
    REQUIRE(e.feasible);
    REQUIRE(plan.searchSeconds >= reference * (1 - 1e-9));
    for (const StagePlan& s : search.best.stages)
      if (s.tensorParallel > 1) {
        ++sharded;
        break;
      }
    ++feasible;
  }
  INFO(feasible << " feasible, " << infeasible << " infeasible, " << sharded << " with t > 1");
  REQUIRE(feasible >= 60);
  REQUIRE(infeasible >= 5);
  REQUIRE(sharded >= 10);
}

// Note [Bounds without recomputation] in decomposer/dp_bounds.cpp: with recompute=auto the bounds
// take, per stage, the least over both settings of those that fit. They skip the recomputed
// setting where the stage fits without it; had that skipped a faster recomputed stage, the
// auto bounds would exceed the always-recompute ones somewhere.
TEST_CASE("prefix bounds with recompute=auto are below those of either forced setting",
          "[decomposer]") {
  std::mt19937 rng(77);
  int compared = 0, below = 0;
  for (int instance = 0; instance < 120; ++instance) {
    const int blocks = 1 + static_cast<int>(rng() % 8);
    const int devices = 1 + static_cast<int>(rng() % 8);
    PlanRequest request = testing::randomRequest(rng, blocks, devices);
    request.devicesPerNode = std::vector<int>{2, 4, 8}[rng() % 3];
    if (instance % 2 == 0) {
      request.options.tensorParallel = "auto";
      addShardableParts(rng, request);
    }
    const int unit = deviceUnit(devices), units = devices / unit;
    const std::vector<int> replicaUnits = replicaCandidates(units);
    const std::vector<int> degrees =
        request.options.tensorParallelCandidates(request.devicesPerNode);
    const int microBatches = std::vector<int>{1, 2, 4}[rng() % 3];
    const Schedule schedule = instance % 3 == 0 ? Schedule::OneFOneB : Schedule::GPipe;
    auto bounds = [&](const char* recompute) {
      PlanRequest r = request;
      r.options.recompute = recompute;
      return PrefixBounds(CostModel(r), microBatches, schedule, unit, units, replicaUnits, degrees);
    };
    const PrefixBounds automatic = bounds("auto"), never = bounds("never"),
                       always = bounds("always");
    INFO("instance " << instance << "\n" << request.toText());
    for (int a = 0; a <= blocks; ++a)
      for (int u = 0; u <= units; ++u) {
        const double least = std::min(never.sum(a, u), always.sum(a, u));
        REQUIRE(automatic.sum(a, u) <= least * (1 + 1e-12));
        REQUIRE(automatic.max(a, u) <= std::min(never.max(a, u), always.max(a, u)) * (1 + 1e-12));
        for (int k = 0; k < 2; ++k)
          REQUIRE(automatic.maxPart(k, a, u) <=
                  std::min(never.maxPart(k, a, u), always.maxPart(k, a, u)) * (1 + 1e-12));
        if (least < kInf) ++compared;
        if (automatic.sum(a, u) < least * (1 - 1e-9)) ++below;  // each stage its own setting
      }
  }
  INFO(compared << " finite cells, " << below << " strictly below both");
  REQUIRE(compared > 500);
  REQUIRE(below > 0);
}

namespace {

// `layers` blocks shaped as a GPT layer's costs: 8 GB of parameters, 7.9 GB in its linear
// layers; with Adam (opt_param_factor 2) 32 GB per device unsharded, over the 14.4 GB usable of
// 16 GB devices even with ZeRO-1 over 8 replicas (8 + 8 + 16/8 GB). Sharded 8 ways a layer needs
// about 4.2 GB.
PlanRequest gptLayers(int layers, int devices, int64_t batch) {
  PlanRequest request;
  for (int i = 0; i < layers; ++i) {
    BlockCost b;
    b.name = "layer" + std::to_string(i);
    b.forwardSeconds = {1e-3, 5e-3};
    b.backwardSeconds = {2e-3, 1e-2};
    b.activationBytes = {0, 2e8};
    b.workingBytes = {0, 1e7};
    b.cutBytesAfter = {0, 2e7};
    b.paramBytes = 8e9;
    request.blocks.push_back(b);
    request.shardable.push_back(
        {i, i, {{9e-4, 4.5e-3}, {1.8e-3, 9e-3}, {0, 1.5e8}, 7.9e9, 2, {0, 4e7}}});
  }
  request.devices = devices;
  request.devicesPerNode = 8;
  request.deviceMemory = 16e9;
  request.batchSize = batch;
  request.comm.allreduceIntraNode = {1e-5, 1e11};
  request.comm.allreduceInterNode = {5e-5, 1e10};
  request.comm.p2pIntraNode = {1e-6, 1e11};
  request.comm.p2pInterNode = {1e-5, 1e10};
  return request;
}

}  // namespace

TEST_CASE("a layer too large for one device is planned tensor-parallel", "[decomposer]") {
  PlanRequest request = gptLayers(3, 8, 8);

  SECTION("tensor_parallel=1: a PlanError that names tensor_parallel") {
    try {
      planStages(request);
      FAIL("planned a layer that does not fit");
    } catch (const PlanError& e) {
      INFO(e.what());
      REQUIRE(std::string(e.what()).find("tensor_parallel=auto") != std::string::npos);
    }
  }
  SECTION("tensor_parallel=auto: every stage sharded, and the plan fits") {
    request.options.tensorParallel = "auto";
    const Plan plan = planStages(request);
    INFO(plan.toString());
    const PlanEvaluation e = evaluatePlan(request, plan);
    REQUIRE(e.feasible);
    REQUIRE(e.peakMemoryBytes <= request.memoryLimit());
    for (const StagePlan& s : plan.stages) REQUIRE(s.tensorParallel > 1);
    REQUIRE(plan.toString().find("tp=") != std::string::npos);
  }
}

TEST_CASE("interleaved plans shard their stages where the option allows", "[decomposer]") {
  // Note [Interleaved search]: 4 GPT-sized layers on 2 nodes of 8 devices, 2 virtual stages per
  // position. Unsharded no position fits; at degree 4 or 8 each rank holds 1/t of the linear
  // layers of its 2 stages.
  PlanRequest request = gptLayers(4, 16, 16);
  request.options.virtualStages = "2";
  request.options.schedule = "1f1b";
  REQUIRE_THROWS_AS(planStages(request), PlanError);  // tensor_parallel=1: nothing fits

  request.options.tensorParallel = "auto";
  const Plan plan = planStages(request);
  INFO(plan.toString());
  REQUIRE(plan.virtualStages == 2);
  REQUIRE(plan.stages.size() == 4);
  const PlanEvaluation e = evaluatePlan(request, plan);
  REQUIRE(e.feasible);
  REQUIRE(e.peakMemoryBytes <= request.memoryLimit());
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& st = plan.stages[s];
    CHECK(st.tensorParallel == plan.stages[0].tensorParallel);  // one degree for all
    CHECK(st.tensorParallel > 1);
    CHECK(st.firstRank % st.tensorParallel == 0);
    CHECK(st.firstRank == plan.stages[s % 2].firstRank);  // a position's virtual stages
  }
  // Each stage's estimate is the cost model's at its degree (the transfers that wrap around
  // aside): the sharded compute / t with the all-reduces.
  const CostModel model(request);
  const StagePlan& st = plan.stages[1];
  const StageEstimate alone =
      model.stage(StageChoice{st.firstBlock, st.lastBlock, st.replicaCount, st.firstRank,
                              st.recompute, 2, st.zero, st.tensorParallel},
                  plan.microBatchCount, plan.schedule);
  CHECK(e.stages[1].forwardSeconds == Approx(alone.forwardSeconds));
  CHECK(e.stages[1].paramBytes == Approx(alone.paramBytes));
  CHECK(alone.tensorParallelForwardSeconds > 0);
  // A virtual stage off its position's degree is named.
  Plan bad = plan;
  bad.stages[3].tensorParallel = st.tensorParallel == 8 ? 4 : 8;
  bad.stages[3].replicaCount = 8 / bad.stages[3].tensorParallel;
  REQUIRE_THAT(evaluatePlan(request, bad).problem, Catch::Contains("virtual stage 1"));
}

TEST_CASE("tensor_parallel option: values, candidates and node fit", "[decomposer]") {
  PlanOptions options;
  REQUIRE(options.tensorParallelCandidates(8) == std::vector<int>{1});
  options.tensorParallel = "auto";
  REQUIRE(options.tensorParallelCandidates(8) == std::vector<int>{1, 2, 4, 8});
  REQUIRE(options.tensorParallelCandidates(6) == std::vector<int>{1, 2});
  options.tensorParallel = "4";
  REQUIRE(options.tensorParallelCandidates(8) == std::vector<int>{4});
  REQUIRE_THROWS_WITH(options.tensorParallelCandidates(2),
                      Catch::Contains("tensor_parallel=4") && Catch::Contains("2 devices"));
  options.tensorParallel = "3";
  REQUIRE_THROWS_WITH(options.validate(), Catch::Contains("tensor_parallel='3'"));
}

TEST_CASE("the baselines plan the forced tensor-parallel degree, with replicas of its ranks",
          "[decomposer]") {
  PlanRequest request = oneLayer();
  request.options.tensorParallel = "2";
  request.options.zero = "1";
  for (const char* name : {"data_parallel", "uniform", "param_balanced"}) {
    INFO(name);
    request.options.decomposer = name;
    const Plan plan = planStages(request);
    int rank = 0;
    for (const StagePlan& s : plan.stages) {
      CHECK(s.tensorParallel == 2);
      CHECK(s.firstRank == rank);
      CHECK(s.zero == (s.replicaCount > 1));
      rank += s.rankCount();
    }
    CHECK(rank <= request.devices);
    REQUIRE(evaluatePlan(request, plan).feasible);
  }
  // One stage over the 4 devices: 2 replicas of 2 ranks, the optimizer state split over them.
  request.options.decomposer = "data_parallel";
  const Plan plan = planStages(request);
  REQUIRE(plan.stages.size() == 1);
  CHECK(plan.stages[0].replicaCount == 2);
  CHECK(plan.stages[0].zero);
  // auto: the baselines choose among the degrees as the DP does.
  request.options.tensorParallel = "auto";
  request.options.zero = "auto";
  // A layer's parameters, gradients and Adam state (4e8 bytes) fit only when split.
  request.deviceMemory = 3.3e8;
  for (const char* name : {"uniform", "param_balanced"}) {
    INFO(name);
    request.options.decomposer = name;
    for (const StagePlan& s : planStages(request).stages) CHECK(s.tensorParallel > 1);
    request.options.tensorParallel = "1";
    REQUIRE_THROWS_AS(planStages(request), PlanError);
    request.options.tensorParallel = "auto";
  }
}

TEST_CASE("the evaluator refuses tensor-parallel stages it cannot place", "[decomposer]") {
  PlanRequest request = oneLayer();
  Plan plan;
  plan.microBatchCount = 2;
  plan.schedule = Schedule::OneFOneB;
  plan.stages = {{0, 0, 1, 0, false, false, 1}, {1, 1, 1, 1, false, false, 2}};
  // Stage 1's pair starts at rank 1: across its node's pairs.
  REQUIRE_THAT(evaluatePlan(request, plan).problem, Catch::Contains("on one node"));
  plan.stages = {{0, 0, 1, 0, false, false, 2}, {1, 1, 1, 2, false, false, 2}};
  REQUIRE(evaluatePlan(request, plan).feasible);
  request.devicesPerNode = 1;
  REQUIRE_THAT(evaluatePlan(request, plan).problem, Catch::Contains("tensor_parallel=2"));
}

TEST_CASE("a stage's sharded time is the profile's measured time on a member where it has one",
          "[decomposer]") {
  // Note [Tensor-parallel profile] (profiler/split_profile.h): block 0's pattern measured at 2.
  PlanRequest request = oneLayer();
  const ShardableSpan::MemberTimes measured{{5e-4, 6e-5}, {1.1e-3, 1.2e-4}};
  request.shardable[0].measured[ShardableSpan::slot(2)] = measured;
  const CostModel model(request);
  for (int t : {2, 4}) {
    INFO("degree " << t);
    StageChoice split{0, 0, 4 / t, 0, false, 0, false, t};
    const StageEstimate e = model.stage(split, 4, Schedule::GPipe);
    // 16 rows, 4 micro-batches, 4 / t replicas
    REQUIRE(e.microBatchPerReplica == (t == 2 ? 2 : 4));
    const double b = e.microBatchPerReplica;
    const double fwd = t == 2 ? 5e-4 + 6e-5 * b : (8e-4 + 8e-5 * b) / 4;
    const double bwd = t == 2 ? 1.1e-3 + 1.2e-4 * b : (1.6e-3 + 1.6e-4 * b) / 4;
    REQUIRE(near(e.forwardSeconds,
                 (1e-3 - 8e-4) + (1e-4 - 8e-5) * b + fwd + e.tensorParallelForwardSeconds));
    REQUIRE(near(e.backwardSeconds,
                 (2e-3 - 1.6e-3) + (2e-4 - 1.6e-4) * b + bwd + e.tensorParallelBackwardSeconds));
    // Block 1's pattern, not measured, is the whole / t at every degree.
    split.firstBlock = split.lastBlock = 1;
    const StageEstimate other = model.stage(split, 4, Schedule::GPipe);
    REQUIRE(near(other.forwardSeconds, (1e-3 - 8e-4) + (1e-4 - 8e-5) * b + (8e-4 + 8e-5 * b) / t +
                                           other.tensorParallelForwardSeconds));
  }
  // Two blocks in one stage: the measured span and the divided one, summed.
  const StageEstimate both = model.stage(StageChoice{0, 1, 2, 0, false, 0, false, 2}, 4,
                                         Schedule::GPipe);
  REQUIRE(near(both.forwardSeconds, 2 * ((1e-3 - 8e-4) + (1e-4 - 8e-5) * 2) + 5e-4 + 6e-5 * 2 +
                                        (8e-4 + 8e-5 * 2) / 2 + both.tensorParallelForwardSeconds));

  // The text form keeps the measured times; the DP plans the same from it.
  const std::string text = request.toText();
  REQUIRE(text.find(" at2 ") != std::string::npos);
  const PlanRequest back = PlanRequest::parse(text);
  REQUIRE(back.shardable[0].measured[0].has_value());
  CHECK(back.shardable[0].measured[0]->backwardSeconds.perSample == 1.2e-4);
  CHECK_FALSE(back.shardable[0].measured[1].has_value());
  CHECK_FALSE(back.shardable[1].measured[0].has_value());
  REQUIRE(back.toText() == text);
  REQUIRE(planStages(back).toString() == planStages(request).toString());
  std::string bad = text;
  bad.replace(bad.find(" at2 "), 5, " at3 ");
  REQUIRE_THROWS_WITH(PlanRequest::parse(bad), Catch::Contains("'at3'"));
  // A member's time above the whole would break the search's lower bounds: refused.
  PlanRequest slower = request;
  slower.shardable[0].measured[0]->forwardSeconds.fixed = 9e-4;
  REQUIRE_THROWS_WITH(slower.validate(), Catch::Contains("measured times at degree 2"));
}

TEST_CASE("a request's shardable spans survive its text form, and so does its plan",
          "[decomposer]") {
  PlanRequest request = oneLayer();
  request.shardable[1].firstBlock = 0;  // one pattern over both blocks, one over the first
  request.shardable[1].cost.allreduceBytes = {3, 5e5};
  request.shardable[1].degrees = (1u << 2) | (1u << 8);
  const std::string text = request.toText();
  REQUIRE(text.find(" 2,4,8\n") != std::string::npos);
  REQUIRE(text.find(" 2,8\n") != std::string::npos);
  REQUIRE(text.find("\nshardable 0 0 ") != std::string::npos);
  REQUIRE(text.find("\nshardable 0 1 ") != std::string::npos);
  const PlanRequest back = PlanRequest::parse(text);
  REQUIRE(back.options.tensorParallel == "auto");
  REQUIRE(back.shardable.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const ShardableSpan &a = request.shardable[i], &b = back.shardable[i];
    CHECK(a.firstBlock == b.firstBlock);
    CHECK(a.lastBlock == b.lastBlock);
    CHECK(a.cost.paramBytes == b.cost.paramBytes);
    CHECK(a.cost.allreducePairs == b.cost.allreducePairs);
    CHECK(a.cost.forwardSeconds.perSample == b.cost.forwardSeconds.perSample);
    CHECK(a.cost.backwardSeconds.fixed == b.cost.backwardSeconds.fixed);
    CHECK(a.cost.activationBytes.perSample == b.cost.activationBytes.perSample);
    CHECK(a.cost.allreduceBytes.fixed == b.cost.allreduceBytes.fixed);
    CHECK(a.cost.allreduceBytes.perSample == b.cost.allreduceBytes.perSample);
    CHECK(a.degrees == b.degrees);
  }
  REQUIRE(back.toText() == text);
  REQUIRE(planStages(back).toString() == planStages(request).toString());
  REQUIRE_THROWS_AS(PlanRequest::parse(text + "shardable 0 x\n"), FormatError);
  // A request written before the degrees were: every degree; a bad list is named.
  std::string old = text;
  for (const char* degrees : {" 2,4,8\n", " 2,8\n"}) {
    const size_t at = old.find(degrees);
    old.replace(at, std::string(degrees).size(), "\n");
  }
  for (const ShardableSpan& s : PlanRequest::parse(old).shardable)
    CHECK(s.degrees == ShardableSpan::kAllDegrees);
  const size_t at = text.find(" 2,8\n");
  std::string bad = text;
  bad.replace(at, 5, " 2,3\n");
  REQUIRE_THROWS_WITH(PlanRequest::parse(bad), Catch::Contains("shardable degrees '2,3'"));
}

TEST_CASE("a pattern counts as split only at the degrees it splits at", "[decomposer]") {
  // Note [Tensor-parallel cost], ShardableSpan::degrees: block 0's pattern splits 2 and 4 ways
  // (e.g. 12 heads), block 1's at no degree (a vocabulary of 50,257 rows).
  PlanRequest request = oneLayer();
  request.devices = request.devicesPerNode = 8;
  request.shardable[0].degrees = (1u << 2) | (1u << 4);
  request.shardable[1].degrees = 0;
  const CostModel model(request);
  const ShardableCost& layer = request.shardable[0].cost;
  for (int t : {2, 4, 8}) {
    CHECK(model.ranges().shardable(0, 0, t).paramBytes == (t == 8 ? 0 : layer.paramBytes));
    CHECK(model.ranges().shardable(1, 1, t).paramBytes == 0);
    CHECK(model.ranges().shardable(0, 1, t).allreducePairs == (t == 8 ? 0 : layer.allreducePairs));
    CHECK(model.ranges().shardableEndingIn(0, 1, t).paramBytes == (t == 8 ? 0 : layer.paramBytes));
  }
  // At degree 8 the stage holds every parameter whole, as tensor_parallel=1, and all-reduces none.
  StageChoice choice{0, 1, 1, 0, false, 0, false, 8};
  const StageEstimate at8 = model.stage(choice, 1, Schedule::OneFOneB);
  choice.tensorParallel = 1;
  const StageEstimate whole = model.stage(choice, 1, Schedule::OneFOneB);
  CHECK(at8.paramBytes == whole.paramBytes);
  CHECK(at8.tensorParallelForwardSeconds == 0);
  CHECK(near(at8.forwardSeconds, whole.forwardSeconds));
  choice.tensorParallel = 4;
  const StageEstimate at4 = model.stage(choice, 1, Schedule::OneFOneB);
  CHECK(near(at4.paramBytes, whole.paramBytes - layer.paramBytes * 3 / 4));
  // tensor_parallel=auto never picks 8 for it: 8 ranks holding what 1 would, slower.
  const Plan plan = planStages(request);
  for (const StagePlan& stage : plan.stages) CHECK(stage.tensorParallel != 8);
}

TEST_CASE("a tensor-parallel stage is as narrow as its degree allows in device units",
          "[decomposer]") {
  // Note [Tensor-parallel units]: (replica units, degree, unit) -> (units spanned, replicas).
  auto shape = [](int r, int t, int unit) {
    const StageShape s = stageShape(r, t, unit);
    return std::pair<int, int>{s.units, s.replicas};
  };
  CHECK(shape(3, 1, 1) == std::pair<int, int>{3, 3});
  CHECK(shape(3, 2, 1) == std::pair<int, int>{6, 3});   // one device per unit: r replicas of t
  CHECK(shape(1, 8, 4) == std::pair<int, int>{2, 1});   // a group wider than a unit
  CHECK(shape(1, 8, 16) == std::pair<int, int>{1, 2});  // two groups in one unit of 16
  CHECK(shape(3, 4, 16) == std::pair<int, int>{3, 12});
  CHECK(shape(5, 1, 64) == std::pair<int, int>{5, 320});
  // On 1,024 devices (units of 16) a degree-8 stage spans one unit: 64 stages fit, as at degree 1.
  PlanRequest request = oneLayer();
  request.devices = 1024;
  request.devicesPerNode = 8;
  request.batchSize = 1024;
  request.options.tensorParallel = "8";
  request.options.partitionNum = 2;
  const Plan plan = planStages(request);
  INFO(plan.toString());
  REQUIRE(plan.stages.size() == 2);
  for (const StagePlan& s : plan.stages) {
    CHECK(s.tensorParallel == 8);
    CHECK(s.rankCount() % 16 == 0);
  }
  REQUIRE(evaluatePlan(request, plan).feasible);
}
