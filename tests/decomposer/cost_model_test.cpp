// Mixed precision in the cost model (Note [Pipeline cost model]): the autocast cast cache and
// boundary bytes in the dtype the stages produce.
#include "decomposer/cost_model.h"

#include <catch2/catch.hpp>

#include "core/error.h"
#include "decomposer/coarsen.h"
#include "decomposer/simulator.h"
#include "uniform_profile.h"

using namespace autostage;
using namespace autostage::decomposer;
using autostage::decomposer::testing::uniformProfile;

namespace {

// Two blocks of 4 MB parameters each, 1 KB per sample crossing the cut between them.
PlanRequest twoBlocks(const std::string& precision) {
  PlanRequest r;
  for (int i = 0; i < 2; ++i) {
    BlockCost b;
    b.forwardSeconds = {1e-3, 1e-4};
    b.backwardSeconds = {2e-3, 2e-4};
    b.activationBytes = {0, 1e4};
    b.workingBytes = {1e3, 1e2};
    b.cutBytesAfter = {0, 1e3};
    b.paramBytes = 4e6;
    r.blocks.push_back(b);
  }
  r.devices = 2;
  r.deviceMemory = 1e9;
  r.batchSize = 16;
  r.options.precision = precision;
  return r;
}

Plan twoStages() {
  Plan plan;
  plan.stages = {{0, 0, 1, 0, false}, {1, 1, 1, 1, false}};
  plan.microBatchCount = 4;
  plan.schedule = Schedule::OneFOneB;
  return plan;
}

// x -> mm(W1) -> relu -> mm(W2) -> sum; the hidden values have dtype `hidden`, as the import
// probe records them under autocast (bf16) or without it (fp32).
core::Graph mlpGraph(core::DType hidden) {
  auto f32 = [](std::vector<int64_t> shape, bool grad = false) {
    return core::Type::tensor(core::DType::Float32, std::move(shape), grad);
  };
  auto low = [&](std::vector<int64_t> shape) { return core::Type::tensor(hidden, std::move(shape), true); };
  core::Graph g("mlp");
  core::ValueId x = g.addInput("x", f32({8, 32}), core::ValueClass::Batch);
  core::ValueId w1 = g.addInput("w1", f32({32, 64}, true), core::ValueClass::Param);
  core::ValueId w2 = g.addInput("w2", f32({64, 64}, true), core::ValueClass::Param);
  core::NodeId m1 = g.addNode("aten::mm", {x, w1}, {low({8, 64})});
  core::NodeId r1 = g.addNode("aten::relu", {g.node(m1).outputs[0]}, {low({8, 64})});
  core::NodeId m2 = g.addNode("aten::mm", {g.node(r1).outputs[0], w2}, {low({8, 64})});
  core::NodeId s = g.addNode("aten::sum", {g.node(m2).outputs[0]}, {f32({}, true)});
  g.addOutput(g.node(s).outputs[0]);
  g.classifyValues();
  return g;
}

}  // namespace

TEST_CASE("bf16 and fp16 add a cast cache of half the parameter bytes", "[decomposer]") {
  PlanRequest fp32 = twoBlocks("fp32"), bf16 = twoBlocks("bf16"), fp16 = twoBlocks("fp16");
  CostModel base(fp32), mixed(bf16), half(fp16);
  StageChoice choice{0, 0, 1, 0, false, 1};
  StageEstimate a = base.stage(choice, 4, Schedule::OneFOneB);
  StageEstimate b = mixed.stage(choice, 4, Schedule::OneFOneB);
  StageEstimate c = half.stage(choice, 4, Schedule::OneFOneB);
  CHECK(a.castCacheBytes == 0);
  CHECK(b.castCacheBytes == Approx(0.5 * 4e6));
  CHECK(c.castCacheBytes == Approx(0.5 * 4e6));
  CHECK(b.totalMemoryBytes - a.totalMemoryBytes == Approx(2e6));
  CHECK(b.baseMemoryBytes - a.baseMemoryBytes == Approx(2e6));
  // Master weights, gradients and optimizer state stay fp32.
  CHECK(b.paramBytes == a.paramBytes);
  CHECK(b.gradientBytes == a.gradientBytes);
  CHECK(b.optimizerBytes == a.optimizerBytes);
  CHECK(b.stageSeconds == a.stageSeconds);

  // The evaluator and the simulator see the same extra bytes on every stage.
  PlanEvaluation ea = evaluatePlan(fp32, twoStages()), eb = evaluatePlan(bf16, twoStages());
  CHECK(eb.peakMemoryBytes - ea.peakMemoryBytes == Approx(2e6));
  SimulationResult sa = simulatePlan(fp32, twoStages()), sb = simulatePlan(bf16, twoStages());
  for (size_t s = 0; s < 2; ++s) {
    CHECK(sb.peakMemoryBytes[s] - sa.peakMemoryBytes[s] == Approx(2e6));
    CHECK(sb.peakMemoryBytes[s] == Approx(eb.stages[s].totalMemoryBytes));
  }
}

TEST_CASE("precision is a validated, replayable planner option", "[decomposer]") {
  PlanRequest r = twoBlocks("bf16");
  PlanRequest back = PlanRequest::parse(r.toText());
  CHECK(back.options.precision == "bf16");
  CHECK(r.options.toString().find("precision=bf16") != std::string::npos);
  r.options.precision = "fp8";
  CHECK_THROWS_AS(r.options.validate(), ConfigError);
  CHECK_THROWS_WITH(r.options.validate(), Catch::Contains("fp32, bf16 or fp16"));
}

TEST_CASE("bf16 boundary values cost half the bytes of fp32 ones", "[decomposer]") {
  core::Graph g32 = mlpGraph(core::DType::Float32), g16 = mlpGraph(core::DType::BFloat16);
  Blocking b32 = buildBlocking(g32, uniformProfile(g32), 8, 8);
  Blocking b16 = buildBlocking(g16, uniformProfile(g16), 8, 8);
  REQUIRE(b32.request.blocks.size() == b16.request.blocks.size());
  REQUIRE(b32.request.blocks.size() >= 2);
  int halved = 0;
  for (size_t i = 0; i + 1 < b32.request.blocks.size(); ++i) {
    const core::LinearCost& cut32 = b32.request.blocks[i].cutBytesAfter;
    const core::LinearCost& cut16 = b16.request.blocks[i].cutBytesAfter;
    CHECK(cut16.perSample == Approx(cut32.perSample / 2));
    CHECK(cut16.fixed == Approx(cut32.fixed / 2));
    halved += cut32.perSample > 0 ? 1 : 0;
  }
  CHECK(halved >= 1);
  // Parameters stay fp32: the same bytes in both requests.
  for (size_t i = 0; i < b32.request.blocks.size(); ++i)
    CHECK(b16.request.blocks[i].paramBytes == b32.request.blocks[i].paramBytes);

  // A stage boundary at the first cut: half the p2p bytes and communication buffers.
  for (Blocking* b : {&b32, &b16}) {
    b->request.devices = 2;
    b->request.deviceMemory = 1e9;
    b->request.batchSize = 8;
  }
  b16.request.options.precision = "bf16";
  CostModel m32(b32.request), m16(b16.request);
  StageChoice first{0, 0, 1, 0, false, 1};
  StageEstimate e32 = m32.stage(first, 1, Schedule::GPipe), e16 = m16.stage(first, 1, Schedule::GPipe);
  REQUIRE(e32.outputBytes > 0);
  CHECK(e16.outputBytes == Approx(e32.outputBytes / 2));
  CHECK(e16.commBufferBytes == Approx(e32.commBufferBytes / 2));
  CHECK(e16.castCacheBytes == Approx(0.5 * e16.paramBytes));
}
