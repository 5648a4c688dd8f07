#include "profiler/cost_model.h"

#include "catch_torch.h"

#include "core/error.h"

using namespace autostage;
using namespace autostage::core;
using namespace autostage::profiler;

namespace {

Type f32(std::vector<int64_t> shape) { return Type::tensor(DType::Float32, std::move(shape)); }

// n0 t(w1) [PARAM]   n1 linear(x, n0)   n2 t(w2) [PARAM, shared by n3 and n5]   n3 linear(n1, n2)
// n4 relu(n3)   n5 linear(n4, n2)   n6 const 2   n7 mul(n5, n6)   n8 sum(n7) [LOSS]
Graph tiedGraph() {
  Graph g("tied");
  ValueId x = g.addInput("x", f32({8, 4}), ValueClass::Batch);
  ValueId w1 = g.addInput("w1", Type::tensor(DType::Float32, {4, 4}, true), ValueClass::Param);
  ValueId w2 = g.addInput("w2", Type::tensor(DType::Float32, {4, 4}, true), ValueClass::Param);
  auto out = [&](NodeId n) { return g.node(n).outputs[0]; };
  NodeId n0 = g.addNode("aten::t", {w1}, {f32({4, 4})});
  NodeId n1 = g.addNode("aten::matmul", {x, out(n0)}, {f32({8, 4})});
  NodeId n2 = g.addNode("aten::t", {w2}, {f32({4, 4})});
  NodeId n3 = g.addNode("aten::matmul", {out(n1), out(n2)}, {f32({8, 4})});
  NodeId n4 = g.addNode("aten::relu", {out(n3)}, {f32({8, 4})});
  NodeId n5 = g.addNode("aten::matmul", {out(n4), out(n2)}, {f32({8, 4})});
  NodeId n6 = g.addNode("prim::Constant", {}, {Type::scalar(TypeKind::Float)}, {{"value", 2.0}});
  NodeId n7 = g.addNode("aten::mul", {out(n5), out(n6)}, {f32({8, 4})});
  NodeId n8 = g.addNode("aten::sum", {out(n7)}, {f32({})});
  g.addOutput(out(n8));
  g.classifyValues();
  return g;
}

GraphProfile uniformProfile(const Graph& g) {
  GraphProfile p;
  p.nodes.resize(g.nodeCount());
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodeCount()); ++n) p.nodes[n].node = n;
  return p;
}

}  // namespace

TEST_CASE("node groups take the PARAM/CONST nodes that feed only one BATCH node", "[profiler]") {
  Graph g = tiedGraph();
  std::vector<NodeGroup> groups = nodeGroups(g);
  REQUIRE(groups.size() == 6);  // n1 n3 n4 n5 n7 n8
  CHECK(groups[0].key == 1);
  CHECK(groups[0].nodes == std::vector<NodeId>{0, 1});  // t(w1) belongs to its only user
  CHECK(groups[1].nodes == std::vector<NodeId>{3});     // shared t(w2) belongs to nobody
  CHECK(groups[3].nodes == std::vector<NodeId>{5});
  CHECK(groups[4].nodes == std::vector<NodeId>{6, 7});  // the constant joins its user
  CHECK(groups[5].nodes == std::vector<NodeId>{8});
}

TEST_CASE("parameter bytes are charged once, to the first BATCH node reached", "[profiler]") {
  Graph g = tiedGraph();
  std::vector<int64_t> bytes = paramBytesByNode(g);
  REQUIRE(bytes.size() == g.nodeCount());
  CHECK(bytes[1] == 64);  // w1 through t()
  CHECK(bytes[3] == 64);  // w2: n3 comes before n5
  CHECK(bytes[5] == 0);
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  CHECK(total == 128);
  CHECK(exampleBatchSize(g) == 8);
}

TEST_CASE("block prediction composes node profiles as documented", "[profiler]") {
  Graph g = tiedGraph();
  GraphProfile p = uniformProfile(g);
  p.calibration = 1.5;
  auto set = [&](NodeId n, LinearCost fwd, LinearCost bwd, LinearCost act, LinearCost work,
                 int64_t params) {
    p.nodes[n].forwardSeconds = fwd;
    p.nodes[n].backwardSeconds = bwd;
    p.nodes[n].activationBytes = act;
    p.nodes[n].workingBytes = work;
    p.nodes[n].paramBytes = params;
  };
  set(1, {1e-3, 1e-4}, {2e-3, 2e-4}, {0, 100}, {50, 10}, 64);
  set(3, {0, 1e-4}, {0, 3e-4}, {0, 200}, {10, 30}, 64);
  set(4, {0, 1e-5}, {0, 1e-5}, {0, 0}, {0, 0}, 0);
  BlockPrediction b = predictBlock(g, p, {1, 2, 3, 4}, 4, 2.0);
  CHECK(b.forwardSeconds == Approx(1.5 * (1e-3 + 4e-4 + 4e-4 + 4e-5)));
  CHECK(b.backwardSeconds == Approx(1.5 * (2e-3 + 8e-4 + 12e-4 + 4e-5)));
  CHECK(b.paramBytes == 128);
  CHECK(b.activationBytes == 400 + 800);
  CHECK(b.workingBytes == std::max(50 + 40, 10 + 120));
  // Boundary inputs: x and w2 (graph inputs: not stage inputs), t(w1) (PARAM: recomputed from
  // the parameter, which is charged already). Outputs: relu (8x4 floats at batch 8 -> 64 bytes
  // at batch 4) and t(w2), which n5 outside the block reads (64 bytes; PARAM, so no gradient
  // comes back for it).
  CHECK(b.inputBytes == 0);
  CHECK(b.outputBytes == 64 + 64);
  CHECK(b.outputGradBytes == 64);
  // Stage inputs and outputs count twice: the tensors and their gradients.
  CHECK(b.peakBytes == 128 * 4 + 1200 + 128 + 64 + 130);
  CHECK(b.feasible);
}

TEST_CASE("a node that failed makes larger batches infeasible", "[profiler]") {
  Graph g = tiedGraph();
  GraphProfile p = uniformProfile(g);
  p.nodes[4].failure = "node 4 aten::relu failed at batch size 16: out of memory";
  p.nodes[4].maxBatch = 8;
  CHECK(predictBlock(g, p, {3, 4}, 8, 0).feasible);
  CHECK_FALSE(predictBlock(g, p, {3, 4}, 16, 0).feasible);
  CHECK(predictBlock(g, p, {5}, 16, 0).feasible);
  CHECK_THROWS_AS(predictBlock(g, p, {99}, 8, 0), PlanError);
  GraphProfile empty;
  CHECK_THROWS_WITH(predictBlock(g, empty, {1}, 8, 0), Catch::Contains("re-profile"));
}

TEST_CASE("linear fits recover lines and stay non-negative", "[profiler]") {
  LinearCost exact = fitLinear({2, 4, 8}, {0.5 + 2 * 0.25, 0.5 + 4 * 0.25, 0.5 + 8 * 0.25});
  CHECK(exact.fixed == Approx(0.5));
  CHECK(exact.perSample == Approx(0.25));
  LinearCost falling = fitLinear({4, 8}, {3.0, 1.0});  // noise: slope would be negative
  CHECK(falling.perSample == 0);
  CHECK(falling.fixed == Approx(2.0));
  LinearCost origin = fitLinear({4, 8}, {1.0, 4.0});  // intercept would be -2
  CHECK(origin.fixed == 0);
  CHECK(origin.perSample == Approx((4 * 1.0 + 8 * 4.0) / (16.0 + 64.0)));
  LinearCost single = fitLinear({8}, {4.0});
  CHECK(single.at(8) == Approx(4.0));
  CHECK(single.at(4) == Approx(2.0));
}
