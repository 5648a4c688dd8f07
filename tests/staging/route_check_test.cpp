#include "staging/route_check.h"

#include "catch_torch.h"
#include <torch/torch.h>

#include "core/error.h"
#include "frontend/torchscript/importer.h"
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

namespace autostage::staging {
namespace {

// Note [One verification]: the fit to the job, for deployments planned here and elsewhere.
TEST_CASE("verifyDeployment checks the job's fit, and a file's graph, batch and memory",
          "[staging]") {
  core::Graph graph = mlpGraph();
  core::Deployment d = testing::makeDeployment(graph, {{0, 1}, {2, 3}}, 4, 1);
  d.graphHash = graph.hash();
  d.batchSize = 32;
  d.deviceMemory = 1000;
  DeploymentFit fit;
  fit.worldSize = 4;
  fit.usage = core::PlanUsage::ForwardBackward;
  fit.graphHash = graph.hash();
  fit.globalBatch = 32;
  fit.deviceMemory = 1000;
  CHECK(verifyDeployment(graph, d, fit).get().stages.size() == 2);
  fit.plannedElsewhere = true;
  CHECK(verifyDeployment(graph, d, fit).get().batchSize == 32);

  SECTION("world size, whatever planned it") {
    fit.plannedElsewhere = false;
    fit.worldSize = 2;
    CHECK_THROWS_AS(verifyDeployment(graph, d, fit), ConfigError);
    CHECK_THROWS_WITH(verifyDeployment(graph, d, fit),
                      Catch::Contains("world_size is 4 but this job has 2 ranks"));
  }
  SECTION("a deployment planned elsewhere for another batch, graph or more memory") {
    fit.globalBatch = 16;
    CHECK_THROWS_WITH(verifyDeployment(graph, d, fit),
                      Catch::Contains("batch_size is 32 but this job's global batch is 16"));
    fit.globalBatch = 32;
    fit.deviceMemory = 999;
    CHECK_THROWS_WITH(verifyDeployment(graph, d, fit),
                      Catch::Contains("device_memory is 1000 bytes but this job's devices have "
                                      "999 bytes"));
    fit.deviceMemory = 0;  // not known: not checked
    CHECK_NOTHROW(verifyDeployment(graph, d, fit));
    fit.graphHash = "0123456789abcdef";
    CHECK_THROWS_AS(verifyDeployment(graph, d, fit), FormatError);
  }
  SECTION("the same fields are not asked of a plan made for this job") {
    fit.plannedElsewhere = false;
    fit.globalBatch = 16;
    fit.graphHash = "other";
    fit.deviceMemory = 1;
    CHECK_NOTHROW(verifyDeployment(graph, d, fit));
  }
  SECTION("ZeRO-1 stages, for a module whose optimizer steps whole parameters") {
    d.stages[0].zero = true;
    CHECK_NOTHROW(verifyDeployment(graph, d, fit));
    fit.shardsOptimizer = false;
    CHECK_THROWS_WITH(verifyDeployment(graph, d, fit),
                      Catch::Contains("stage " + d.stages[0].name) &&
                          Catch::Contains("(ZeRO-1, zero=1), but this module's optimizer steps "
                                          "whole parameters"));
  }
  SECTION("a tensor-parallel stage runs; a degree its ranks cannot be grouped by is refused") {
    d.stages[1].tensorParallel = 2;  // ranks 2 and 3: one replica of two ranks
    CHECK_NOTHROW(verifyDeployment(graph, d, fit));
    d.stages[1].tensorParallel = 3;
    CHECK_THROWS_WITH(verifyDeployment(graph, d, fit), Catch::Contains(d.stages[1].name));
  }
  SECTION("a schedule the call cannot run, and broken routes") {
    d.schedule = "1f1b";
    CHECK_THROWS_WITH(verifyDeployment(graph, d, fit), Catch::Contains("schedule 1f1b"));
    d.schedule = "gpipe";
    d.routes.clear();
    CHECK_THROWS_AS(verifyDeployment(graph, d, fit), PlanError);
  }
}

}  // namespace
}  // namespace autostage::staging
