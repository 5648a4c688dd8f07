#include "frontend/torchscript/exporter.h"

#include "catch_torch.h"

#include "core/error.h"
#include "test_models.h"

namespace autostage::torchscript {
namespace {

using testing::gradientsOf;
using testing::nodeRange;
using testing::runChained;

// Output of the original module and gradients of its parameters (by name), grads reset after.
std::pair<at::Tensor, std::map<std::string, at::Tensor>> reference(torch::jit::Module& m,
                                                                   const ImportedModel& model,
                                                                   const at::Tensor& x) {
  at::Tensor out = m.forward({x}).toTensor();
  return {out.detach().clone(), gradientsOf(model, {out})};
}

void checkSplits(torch::jit::Module m, const at::Tensor& x) {
  ImportedModel model = importModule(m, {x});
  auto [expected, expectedGrads] = reference(m, model, x);
  REQUIRE(expectedGrads.size() == model.paramTensors.size());
  auto n = static_cast<core::NodeId>(model.graph.nodeCount());
  for (core::NodeId split : {n, n / 2, n / 3, n - 1}) {
    INFO("split at node " << split << " of " << n);
    std::vector<std::vector<core::NodeId>> parts = {nodeRange(0, split)};
    if (split < n) parts.push_back(nodeRange(split, n));
    std::vector<at::Tensor> outputs = runChained(model, {x}, parts);
    REQUIRE(outputs.size() == 1);
    CHECK(torch::equal(outputs[0], expected));
    auto grads = gradientsOf(model, outputs);
    REQUIRE(grads.size() == expectedGrads.size());
    for (const auto& [name, g] : expectedGrads) {
      INFO("gradient of " << name);
      CHECK(torch::equal(grads.at(name), g));
    }
  }
}

TEST_CASE("MLP: whole and split exports reproduce output and gradients", "[torchscript]") {
  torch::manual_seed(1);
  checkSplits(testing::makeMlp(), torch::randn({5, 8}));
}

TEST_CASE("loop model: whole and split exports reproduce output and gradients", "[torchscript]") {
  torch::manual_seed(2);
  checkSplits(testing::makeLoopModel(), torch::randn({4, 8}));
}

TEST_CASE("control flow without outputs: whole and split exports reproduce output and gradients",
          "[torchscript]") {
  torch::manual_seed(4);
  torch::jit::Module m = testing::makeInPlaceLoopModel();
  at::Tensor x = torch::randn({3, 8});
  checkSplits(m, x);
  // The clamping loop carries the value it writes, so the readers after it depend on it.
  ImportedModel model = importModule(m, {x});
  bool threaded = false;
  for (const core::Node& n : model.graph.nodes())
    threaded = threaded || (n.kind == "prim::Loop" && n.outputs.size() == 1);
  CHECK(threaded);
}

TEST_CASE("export boundary matches Graph::boundary", "[torchscript]") {
  ImportedModel model = importModule(testing::makeMlp(), {torch::randn({2, 8})});
  auto half = nodeRange(0, static_cast<core::NodeId>(model.graph.nodeCount() / 2));
  ExportedFunction fn = exportSubgraph(model.graph, half);
  core::Boundary b = model.graph.boundary(half);
  CHECK(fn.inputs() == b.inputs);
  CHECK(fn.outputs() == b.outputs);
  CHECK(fn.graph()->inputs().size() == b.inputs.size());
  CHECK_THROWS_AS(fn.run({}), Error);
}

TEST_CASE("export rejects a non-convex subset, naming it", "[torchscript]") {
  ImportedModel model = importModule(testing::makeMlp(), {torch::randn({2, 8})});
  const core::Graph& g = model.graph;
  // First matmul and the last node: the path between them runs through nodes left out.
  core::NodeId first = -1;
  for (const auto& node : g.nodes())
    if (node.kind == "aten::matmul" && first < 0) first = node.id;
  REQUIRE(first >= 0);
  core::NodeId last = static_cast<core::NodeId>(g.nodeCount()) - 1;
  REQUIRE(!g.isConvex({first, last}));
  CHECK_THROWS_WITH(exportSubgraph(g, {first, last}),
                    Catch::Contains("non-convex subset") &&
                        Catch::Contains(std::to_string(first) + ", " + std::to_string(last)));
  CHECK_THROWS_AS(exportSubgraph(g, {}), PlanError);
  CHECK_THROWS_AS(exportSubgraph(g, {0, 0}), PlanError);
}

}  // namespace
}  // namespace autostage::torchscript
