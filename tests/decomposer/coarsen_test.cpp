#include "decomposer/coarsen.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "decomposer/synthetic.h"
#include "uniform_profile.h"

using namespace autostage;
using namespace autostage::decomposer;
using autostage::decomposer::testing::uniformProfile;
using core::NodeId;
using core::ValueId;

namespace {

core::Type tensor(std::vector<int64_t> shape, bool grad = false) {
  return core::Type::tensor(core::DType::Float32, std::move(shape), grad);
}

SyntheticModel smallBert(int layers) {
  TransformerShape s;
  s.layers = layers;
  s.hidden = 256;
  s.heads = 4;
  s.sequence = 128;
  s.vocabulary = 1000;
  return syntheticTransformer(s, DeviceModel{});
}

// Layer index of a scope `layers.K...`, -1 outside the layers.
int layerOf(const std::string& scope) {
  if (scope.rfind("layers.", 0) != 0) return -1;
  return std::stoi(scope.substr(7));
}

}  // namespace

TEST_CASE("atomic groups replicate shared PARAM nodes and keep dead ones", "[decomposer]") {
  core::Graph g("shared");
  ValueId x = g.addInput("x", tensor({2, 4}), core::ValueClass::Batch);
  ValueId w = g.addInput("w", tensor({4, 4}, true), core::ValueClass::Param);
  NodeId t = g.addNode("aten::t", {w}, {tensor({4, 4}, true)});
  NodeId dead = g.addNode("aten::neg", {w}, {tensor({4, 4}, true)});
  NodeId m1 = g.addNode("aten::matmul", {x, g.node(t).outputs[0]}, {tensor({2, 4})});
  NodeId m2 = g.addNode("aten::matmul", {g.node(m1).outputs[0], g.node(t).outputs[0]}, {tensor({2, 4})});
  NodeId loss = g.addNode("aten::sum", {g.node(m2).outputs[0]}, {core::Type::tensor(core::DType::Float32, {})});
  g.addOutput(g.node(loss).outputs[0]);
  g.classifyValues();

  std::vector<AtomicGroup> groups = atomicGroups(g);
  REQUIRE(groups.size() == 3);
  REQUIRE(groups[0].main == m1);
  REQUIRE(groups[0].attached == std::vector<NodeId>{t, dead});  // t needed, dead joins the first
  REQUIRE(groups[1].main == m2);
  REQUIRE(groups[1].attached == std::vector<NodeId>{t});  // replicated, not cut from its consumer
  REQUIRE(groups[0].params == std::vector<ValueId>{w});
  REQUIRE(groups[1].params == std::vector<ValueId>{w});
  REQUIRE(groups[2].attached.empty());
}

TEST_CASE("synthetic transformer layers have kTransformerLayerNodes IR nodes", "[decomposer]") {
  REQUIRE(smallBert(3).graph.nodeCount() - smallBert(2).graph.nodeCount() == kTransformerLayerNodes);
}

TEST_CASE("blocks are convex and cover every node and cuts equal the prefix boundary", "[decomposer]") {
  SyntheticModel m = smallBert(3);
  Blocking b = buildBlocking(m.graph, m.profile, 20, 8);
  REQUIRE(b.blockCount() == 20);
  std::set<NodeId> covered;
  for (int blk = 0; blk < b.blockCount(); ++blk) {
    std::vector<NodeId> nodes = b.stageNodes(blk, blk);
    REQUIRE(m.graph.isConvex(nodes));
    covered.insert(nodes.begin(), nodes.end());
    // Reference: BATCH values leaving the prefix [0, blk] per Graph::boundary, sized from types.
    std::vector<NodeId> prefix = b.stageNodes(0, blk);
    double perSample = 0, fixed = 0;
    for (ValueId v : m.graph.boundary(prefix).outputs) {
      const core::Value& value = m.graph.value(v);
      if (value.cls != core::ValueClass::Batch || m.graph.isGraphOutput(v)) continue;
      if (value.type.isTensor()) perSample += static_cast<double>(value.type.bytes()) / value.type.shape()[0];
      else fixed += 8;
    }
    if (blk + 1 < b.blockCount()) {
      REQUIRE(b.request.blocks[blk].cutBytesAfter.perSample == Approx(perSample));
      REQUIRE(b.request.blocks[blk].cutBytesAfter.fixed == Approx(fixed));
    }
  }
  REQUIRE(covered.size() == m.graph.nodeCount());
}

// In the synthetic transformer only the hidden state crosses a layer boundary, and likewise the
// boundary between a layer's attention and its MLP: these are the cheapest cuts. Coarsening must
// keep its block boundaries on them, and with room for two blocks per layer keep every layer
// boundary.
TEST_CASE("coarsening keeps block boundaries on the cheapest cuts (layer boundaries)", "[decomposer]") {
  const int layers = 8;
  SyntheticModel m = smallBert(layers);
  const double hiddenPerSample = 128.0 * 256 * 2;  // seq x hidden x Float16
  for (int maxBlocks : {layers + 2, 2 * layers + 2}) {
    Blocking b = buildBlocking(m.graph, m.profile, maxBlocks, 8);
    std::set<int> layerStarts;
    for (int blk = 0; blk + 1 < b.blockCount(); ++blk) {
      INFO("max_blocks " << maxBlocks << ", boundary after block " << blk << " (" << b.request.blocks[blk].name << ")");
      REQUIRE(b.request.blocks[blk].cutBytesAfter.perSample == Approx(hiddenPerSample));
      const core::Node& next = m.graph.node(b.groups[b.blockFirstGroup[blk + 1]].main);
      if (next.scope.size() > 7 && next.scope.find(".ln1") != std::string::npos) layerStarts.insert(layerOf(next.scope));
    }
    if (maxBlocks == 2 * layers + 2) REQUIRE(layerStarts.size() == layers);
  }
}

TEST_CASE("tied embedding is a parameter shared by the first and last block", "[decomposer]") {
  TransformerShape s;
  s.layers = 2;
  s.hidden = 128;
  s.heads = 2;
  s.sequence = 64;
  s.vocabulary = 5000;
  s.tiedHead = true;
  SyntheticModel m = syntheticTransformer(s, DeviceModel{});
  Blocking b = buildBlocking(m.graph, m.profile, 6, 8);
  const double embeddingBytes = 5000.0 * 128 * 2;  // Float16
  bool found = false;
  for (const SharedParam& p : b.request.sharedParams)
    if (p.bytes == embeddingBytes && p.blocks.front() == 0 && p.blocks.back() == b.blockCount() - 1) found = true;
  REQUIRE(found);
}

TEST_CASE("the profile calibration factor scales block times but not bytes", "[decomposer]") {
  SyntheticModel m = smallBert(2);
  Blocking plain = buildBlocking(m.graph, m.profile, 16, 8);
  m.profile.calibration = 1.5;
  Blocking calibrated = buildBlocking(m.graph, m.profile, 16, 8);
  REQUIRE(plain.request.blocks.size() == calibrated.request.blocks.size());
  for (size_t i = 0; i < plain.request.blocks.size(); ++i) {
    const BlockCost& a = plain.request.blocks[i];
    const BlockCost& b = calibrated.request.blocks[i];
    CHECK(b.forwardSeconds.at(8) == Approx(1.5 * a.forwardSeconds.at(8)));
    CHECK(b.backwardSeconds.at(8) == Approx(1.5 * a.backwardSeconds.at(8)));
    CHECK(b.activationBytes == a.activationBytes);
  }
}

// Note [Non-tensor values are not cut]: the int of aten::size and the list built from it are
// read three groups later; no block boundary may fall between, even with room for one block per
// group, while the tensor-only boundaries stay cuttable.
TEST_CASE("boundaries crossed by non-tensor values are never block boundaries", "[decomposer]") {
  core::Graph g("sized");
  ValueId x = g.addInput("x", tensor({8, 4}), core::ValueClass::Batch);
  ValueId zero = g.node(g.addNode("prim::Constant", {}, {core::Type::scalar(core::TypeKind::Int)})).outputs[0];
  auto relu = [&](ValueId in) { return g.node(g.addNode("aten::relu", {in}, {tensor({8, 4})})).outputs[0]; };
  ValueId a = relu(x);                                                                   // group 0
  NodeId size = g.addNode("aten::size", {a, zero}, {core::Type::scalar(core::TypeKind::Int)});  // 1
  ValueId b = relu(a);                                                                   // group 2
  ValueId c = relu(b);                                                                   // group 3
  ValueId minusOne = g.node(g.addNode("prim::Constant", {}, {core::Type::scalar(core::TypeKind::Int)})).outputs[0];
  NodeId list = g.addNode("prim::ListConstruct", {g.node(size).outputs[0], minusOne},
                          {core::Type::list(core::Type::scalar(core::TypeKind::Int))});  // group 4
  NodeId view = g.addNode("aten::view", {c, g.node(list).outputs[0]}, {tensor({8, 4})});  // group 5
  ValueId d = relu(g.node(view).outputs[0]);                                            // group 6
  NodeId loss = g.addNode("aten::sum", {d}, {core::Type::tensor(core::DType::Float32, {})});
  g.addOutput(g.node(loss).outputs[0]);
  g.classifyValues();

  core::GraphProfile profile = uniformProfile(g);
  Blocking blocking = buildBlocking(g, profile, 100, 8);
  REQUIRE(blocking.groups.size() == 8);
  REQUIRE(blocking.groups[1].main == size);
  REQUIRE(blocking.groups[5].main == view);
  // Groups 1..5 form one block; the tensor-only boundaries after groups 0, 5 and 6 remain.
  REQUIRE(blocking.blockFirstGroup == std::vector<int>{0, 1, 6, 7, 8});
  for (int blk = 0; blk < blocking.blockCount(); ++blk)
    REQUIRE(g.isConvex(blocking.stageNodes(blk, blk)));
  // max_blocks cannot undo the pin: asking for 8 blocks still gives 4.
  REQUIRE(buildBlocking(g, profile, 8, 8).blockCount() == 4);
}

// A [batch*4] flattening (dim 0 is not the traced batch 8) cannot be split by samples either.
TEST_CASE("boundaries crossed by tensors whose dim 0 is not the batch are never block boundaries",
          "[decomposer]") {
  core::Graph g("flattened");
  ValueId x = g.addInput("x", tensor({8, 4}), core::ValueClass::Batch);
  auto op = [&](const char* kind, ValueId in, std::vector<int64_t> shape) {
    return g.node(g.addNode(kind, {in}, {tensor(std::move(shape))})).outputs[0];
  };
  ValueId a = op("aten::relu", x, {8, 4});        // group 0
  ValueId flat = op("aten::flatten", a, {32});    // group 1
  ValueId b = op("aten::relu", flat, {32});       // group 2
  ValueId back = op("aten::reshape", b, {8, 4});  // group 3
  ValueId c = op("aten::relu", back, {8, 4});     // group 4
  NodeId loss = g.addNode("aten::sum", {c}, {core::Type::tensor(core::DType::Float32, {})});
  g.addOutput(g.node(loss).outputs[0]);
  g.classifyValues();
  core::GraphProfile profile = uniformProfile(g);
  Blocking blocking = buildBlocking(g, profile, 100, 8);
  REQUIRE(blocking.groups.size() == 6);
  // The 0-dim loss is a graph output read by no later group, so the cut before it stays.
  REQUIRE(blocking.blockFirstGroup == std::vector<int>{0, 1, 4, 5, 6});
}

// Note [Rows of a value]: a per-expert value whose expert count equals the traced batch (8) looks
// batch-major by its shape; marked not_batch_major by the front end, it pins its boundaries.
TEST_CASE("tensors marked not_batch_major are never cut even when dim 0 equals the batch",
          "[decomposer]") {
  auto build = [](bool marked) {
    core::Graph g("experts");
    ValueId x = g.addInput("x", tensor({8, 4}), core::ValueClass::Batch);
    auto op = [&](const char* kind, ValueId in, core::Type type) {
      return g.node(g.addNode(kind, {in}, {std::move(type)})).outputs[0];
    };
    core::Type perExpert = marked ? tensor({8, 4}).withNotBatchMajor() : tensor({8, 4});
    ValueId a = op("aten::relu", x, tensor({8, 4}));       // group 0
    ValueId experts = op("aten::index_add", a, perExpert);  // group 1
    ValueId b = op("aten::relu", experts, perExpert);       // group 2
    ValueId back = op("aten::index_select", b, tensor({8, 4}));  // group 3
    ValueId c = op("aten::relu", back, tensor({8, 4}));     // group 4
    NodeId loss = g.addNode("aten::sum", {c}, {core::Type::tensor(core::DType::Float32, {})});
    g.addOutput(g.node(loss).outputs[0]);
    g.classifyValues();
    core::GraphProfile profile = uniformProfile(g);
    return buildBlocking(g, profile, 100, 8).blockFirstGroup;
  };
  REQUIRE(build(false) == std::vector<int>{0, 1, 2, 3, 4, 5, 6});  // indistinguishable by shape
  REQUIRE(build(true) == std::vector<int>{0, 1, 4, 5, 6});
}
