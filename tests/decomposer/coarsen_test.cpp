#include "decomposer/coarsen.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "decomposer/synthetic.h"

using namespace autostage;
using namespace autostage::decomposer;
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

TEST_CASE("synthetic transformer layers have 76 IR nodes", "[decomposer]") {
  REQUIRE(smallBert(3).graph.nodeCount() - smallBert(2).graph.nodeCount() == 76);
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
