#include "decomposer/plan.h"
#include "decomposer/plan_option_fields.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "core/config.h"
#include "core/error.h"
#include "decomposer/baselines.h"
#include "random_requests.h"

using namespace autostage;
using namespace autostage::decomposer;

TEST_CASE("plan request text form replays to the same plan", "[decomposer]") {
  std::mt19937 rng(3);
  PlanRequest r = testing::randomRequest(rng, 6, 4);
  r.deviceMemory = 1e12;
  r.sharedParams.push_back({1.5e8, {1, 4}});
  r.options.partitionNum = 2;
  r.options.recompute = "never";
  PlanRequest back = PlanRequest::parse(r.toText());
  REQUIRE(back.toText() == r.toText());
  Plan a = planStages(r), b = planStages(back);
  REQUIRE(a.stages == b.stages);
  REQUIRE(a.predictedSeconds == b.predictedSeconds);
  REQUIRE(a.searchSeconds == b.searchSeconds);
  REQUIRE_THROWS_AS(PlanRequest::parse("autostage-plan-request 1\nblock x 1 2\n"), FormatError);
}

TEST_CASE("plan options come from the config table and are validated", "[decomposer]") {
  core::Config config;
  config.set("decomposer", "uniform");
  config.set("max_pipeline", "8");
  config.set("schedule", "1f1b");
  PlanOptions o = PlanOptions::fromConfig(config);
  REQUIRE(o.decomposer == "uniform");
  REQUIRE(o.microBatchCandidates(64) == std::vector<int>{1, 2, 4, 8});
  // Note [Free micro-batch counts]: the powers of two and every count dividing the batch.
  PlanOptions free = o;
  free.maxPipeline = 64;
  REQUIRE(free.microBatchCandidates(24) == std::vector<int>{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64});
  REQUIRE(free.microBatchCandidates(7) == std::vector<int>{1, 2, 4, 7, 8, 16, 32, 64});
  free.minPipeline = 5;
  free.maxPipeline = 30;
  REQUIRE(free.microBatchCandidates(24) == std::vector<int>{6, 8, 12, 16, 24});
  free.minPipeline = 1;
  free.maxPipeline = 4096;  // Megatron-LM's 310B GPT: 2,160 samples, 144 micro-batches x 15
  const std::vector<int> counts = free.microBatchCandidates(2160);
  REQUIRE(std::count(counts.begin(), counts.end(), 144) == 1);
  REQUIRE(counts.size() == 40 + 13 - 5);  // 40 divisors, 13 powers of two, 5 of them both
  // Note [Fixed micro-batch size]: every count dividing batch / micro_batch_size, powers of two
  // or not (Megatron-LM's 530B GPT: 2,520 samples, one per micro-batch, over 9 replicas: 280).
  PlanOptions fixed = o;
  fixed.microBatchSize = 2;
  fixed.maxPipeline = 64;
  REQUIRE(fixed.microBatchCandidates(24) == std::vector<int>{1, 2, 3, 4, 6, 12});
  REQUIRE(fixed.microBatchCandidates(25).empty());  // no count gives 2 rows
  fixed.microBatchSize = 1;
  fixed.maxPipeline = 4096;
  const std::vector<int> megatron = fixed.microBatchCandidates(2520);
  REQUIRE(std::count(megatron.begin(), megatron.end(), 280) == 1);
  REQUIRE(megatron.size() == 48);
  REQUIRE(o.scheduleCandidates() == std::vector<Schedule>{Schedule::OneFOneB});
  REQUIRE(o.recomputeCandidates() == std::vector<bool>{false, true});
  config.set("recompute", "always");
  REQUIRE(PlanOptions::fromConfig(config).recomputeCandidates() == std::vector<bool>{true});
  config.set("recompute", "never");
  REQUIRE(PlanOptions::fromConfig(config).recomputeCandidates() == std::vector<bool>{false});
  config.set("recompute", "sometimes");
  REQUIRE_THROWS_WITH(PlanOptions::fromConfig(config), Catch::Contains("recompute='sometimes'"));
  config.set("recompute", "auto");
  config.set("pipeline_num", "4");
  REQUIRE(PlanOptions::fromConfig(config).microBatchCandidates(64) == std::vector<int>{4});
  config.set("decomposer", "magic");
  REQUIRE_THROWS_AS(PlanOptions::fromConfig(config), ConfigError);
  PlanOptions bad;
  bad.memMargin = 1.5;
  REQUIRE_THROWS_AS(bad.validate(), ConfigError);
}

// Note [Plan option fields]: one table, read the same way by every place listing the options.
TEST_CASE("every planner option is one field of the table, in every text form", "[decomposer]") {
  core::Config config;
  PlanOptions o;
  o.decomposer = "uniform";
  o.maxBlocks = 77;
  o.partitionNum = 3;
  o.pipelineNum = 8;
  o.minPipeline = 2;
  o.maxPipeline = 16;
  o.schedule = "1f1b";
  o.recompute = "never";
  o.zero = "1";
  o.virtualStages = "2";
  o.memLimitGb = 12.5;
  o.memMargin = 0.25;
  o.optParamFactor = 1;
  o.gradientBucketBytes = 1 << 20;
  o.precision = "bf16";
  const std::vector<std::string> planInputs = core::planInputOptions();
  for (const std::string& key : planOptionKeys()) {
    INFO(key);
    // A config key, and a plan input (Note [Plan inputs]).
    REQUIRE(std::find(planInputs.begin(), planInputs.end(), key) != planInputs.end());
    config.set(key, planOptionText(o, key), "test");
    PlanOptions fromText;
    setPlanOption(fromText, key, planOptionText(o, key));
    REQUIRE(planOptionText(fromText, key) == planOptionText(o, key));
  }
  // The config, the text form and a plan request's options line all give back every field.
  REQUIRE(PlanOptions::fromConfig(config).toString() == o.toString());
  PlanRequest r;
  r.options = o;
  r.blocks.resize(1);
  REQUIRE(PlanRequest::parse(r.toText()).options.toString() == o.toString());
  REQUIRE(o.toString().find("usage=train_step") != std::string::npos);
  REQUIRE_THROWS_WITH(setPlanOption(o, "max_bloks", "3"),
                      Catch::Contains("planner option 'max_bloks' is unknown") &&
                          Catch::Contains("max_blocks"));
  REQUIRE_THROWS_WITH(setPlanOption(o, "max_blocks", "3x"),
                      Catch::Contains("max_blocks='3x' is not an integer"));
}

TEST_CASE("baseline cuts: uniform by block count and param_balanced by parameter bytes", "[decomposer]") {
  REQUIRE(uniformCuts(10, 3) == std::vector<std::pair<int, int>>{{0, 3}, {4, 6}, {7, 9}});
  PlanRequest r;
  for (double bytes : {8.0, 1.0, 1.0, 1.0, 1.0, 4.0}) {
    BlockCost c;
    c.paramBytes = bytes;
    r.blocks.push_back(c);
  }
  // Total 16: the first stage reaches 8 after block 0, the second 16 at the end.
  REQUIRE(paramBalancedCuts(r, 2) == std::vector<std::pair<int, int>>{{0, 0}, {1, 5}});
  // Targets 5.3 and 10.7: cuts after block 0 (8) and block 3 (11).
  REQUIRE(paramBalancedCuts(r, 3) == std::vector<std::pair<int, int>>{{0, 0}, {1, 3}, {4, 5}});
}

TEST_CASE("the plan usage is part of the request's text form", "[decomposer]") {
  PlanRequest r;
  r.blocks.resize(1);
  r.deviceMemory = 1e9;
  for (PlanUsage usage : {PlanUsage::ForwardBackward, PlanUsage::TrainStep, PlanUsage::Inference}) {
    r.options.usage = usage;
    REQUIRE(PlanRequest::parse(r.toText()).options.usage == usage);
  }
  std::string text = r.toText();
  text.replace(text.find("usage=inference"), 15, "usage=sideways");
  REQUIRE_THROWS_WITH(PlanRequest::parse(text), Catch::Contains("forward_backward, train_step or inference"));
}

TEST_CASE("zero=1 on one device: the baselines plan it unsharded instead of failing",
          "[decomposer]") {
  std::mt19937 rng(5);
  PlanRequest r = testing::randomRequest(rng, 6, 1);
  r.deviceMemory = 1e12;
  r.options.zero = "1";
  for (const char* name : {"data_parallel", "uniform", "param_balanced"}) {
    INFO(name);
    r.options.decomposer = name;
    Plan p = planStages(r);
    REQUIRE(!p.stages.empty());
    for (const StagePlan& s : p.stages) CHECK_FALSE(s.zero);  // one replica: nothing to shard
  }
  r.devices = 4;
  r.options.decomposer = "data_parallel";
  Plan p = planStages(r);
  for (const StagePlan& s : p.stages) CHECK((s.zero == (s.replicaCount > 1)));
}
