#include "staging/route_check.h"

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "core/error.h"
#include "core/torchscript/importer.h"
#include "test_support.h"

namespace autostage::staging {
namespace {

core::Graph mlpGraph() {
  torch::manual_seed(3);
  return torchscript::importModule(testing::makeMlp(), {torch::randn({4, 8})}).graph;
}

TEST_CASE("a deployment derived from the graph passes route verification", "[staging]") {
  core::Graph graph = mlpGraph();
  CHECK_NOTHROW(verifyRoutes(graph, testing::makeDeployment(graph, {{0, 1}, {2}, {3}}, 4, 2)));
}

TEST_CASE("route verification names what is wrong", "[staging]") {
  core::Graph graph = mlpGraph();
  core::Deployment good = testing::makeDeployment(graph, {{0, 1}, {2, 3}}, 4, 1);
  REQUIRE(good.routes.size() >= 3);  // model input, the boundary value, the output

  SECTION("a missing route between stages") {
    core::Deployment d = good;
    auto it = std::find_if(d.routes.begin(), d.routes.end(),
                           [](const core::Route& r) { return r.producerStage == 0; });
    REQUIRE(it != d.routes.end());
    std::string name = graph.value(it->value).name;
    d.routes.erase(it);
    CHECK_THROWS_WITH(verifyRoutes(graph, d),
                      Catch::Contains("reads value '" + name + "'") &&
                          Catch::Contains("no route"));
  }
  SECTION("a wrong producer stage") {
    core::Deployment d = good;
    for (core::Route& r : d.routes)
      if (r.producerStage == 0) r.producerStage = core::kFeederStage;
    CHECK_THROWS_AS(verifyRoutes(graph, d), PlanError);
  }
  SECTION("a node in two stages") {
    core::Deployment d = good;
    d.stages[1].nodes.insert(d.stages[1].nodes.begin(), d.stages[0].nodes.back());
    CHECK_THROWS_WITH(verifyRoutes(graph, d), Catch::Contains("belongs to stages 0 and 1"));
  }
  SECTION("a graph output without a route") {
    core::Deployment d = good;
    for (core::Route& r : d.routes) r.graphOutput = false;
    CHECK_THROWS_WITH(verifyRoutes(graph, d), Catch::Contains("has no route marked graphOutput"));
  }
  SECTION("a batch node left out of every stage") {
    core::Deployment d = good;
    d.stages[1].nodes.pop_back();
    CHECK_THROWS_WITH(verifyRoutes(graph, d), Catch::Contains("is in no stage"));
  }
}

}  // namespace
}  // namespace autostage::staging
