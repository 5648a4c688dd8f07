#include "decomposer/deployment_builder.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "decomposer/atomic_groups.h"
#include "decomposer/planner.h"
#include "decomposer/synthetic.h"

using namespace autostage;
using namespace autostage::decomposer;

namespace {

struct Planned {
  SyntheticModel model;
  PlanResult result;
};

// A 4-layer BERT on 8 devices (2 nodes of 4), forced into `stages` stages.
Planned planSmallBert(int stages) {
  TransformerShape s;
  s.layers = 4;
  s.hidden = 256;
  s.heads = 4;
  s.sequence = 128;
  s.vocabulary = 1000;
  Planned p{syntheticTransformer(s, DeviceModel{}), {}};
  p.model.profile.comm.p2pIntraNode = p.model.profile.comm.allreduceIntraNode = {1e-5, 1e11};
  p.model.profile.comm.p2pInterNode = p.model.profile.comm.allreduceInterNode = {1e-5, 1e10};
  core::ClusterSpec c;
  c.devices = 8;
  c.devicesPerNode = 4;
  c.memoryPerDevice = int64_t{16} << 30;
  PlanOptions o;
  o.partitionNum = stages;
  p.result = planGraph(p.model.graph, p.model.profile, c, 32, o);
  return p;
}

}  // namespace

TEST_CASE("deployment: stages partition the BATCH nodes on disjoint ranks", "[decomposer]") {
  Planned p = planSmallBert(3);
  const core::Graph& g = p.model.graph;
  const core::Deployment& d = p.result.deployment;
  REQUIRE(d.stages.size() == 3);
  REQUIRE(d.worldSize == 8);
  REQUIRE(d.batchSize == 32);
  std::map<core::NodeId, int> owner;
  std::set<int> ranks;
  for (const core::StageDeployment& s : d.stages) {
    REQUIRE(s.name.rfind("STAGE_", 0) == 0);
    REQUIRE(std::is_sorted(s.nodes.begin(), s.nodes.end()));
    for (core::NodeId n : s.nodes)
      if (isBatchNode(g, n)) REQUIRE(owner.emplace(n, s.id).second);
    for (int r : s.ranks) REQUIRE(ranks.insert(r).second);
    REQUIRE(s.totalMemoryBytes <= static_cast<int64_t>(p.result.blocking.request.memoryLimit()));
  }
  size_t batchNodes = 0;
  for (const core::Node& n : g.nodes()) batchNodes += isBatchNode(g, n.id);
  REQUIRE(owner.size() == batchNodes);
  REQUIRE(*ranks.rbegin() < 8);
}

TEST_CASE("deployment routes match the stage boundaries", "[decomposer]") {
  Planned p = planSmallBert(3);
  const core::Graph& g = p.model.graph;
  const core::Deployment& d = p.result.deployment;
  std::map<core::ValueId, const core::Route*> routes;
  for (const core::Route& r : d.routes) routes[r.value] = &r;
  // Reference from Graph::boundary: every BATCH value a stage reads from outside arrives by a
  // route from the stage (or feeder) that produces it.
  std::map<core::NodeId, int> stageOf;
  for (const core::StageDeployment& s : d.stages)
    for (core::NodeId n : s.nodes)
      if (isBatchNode(g, n)) stageOf[n] = s.id;
  int crossing = 0;
  for (const core::StageDeployment& s : d.stages) {
    for (core::ValueId v : g.boundary(s.nodes).inputs) {
      const core::Value& value = g.value(v);
      if (value.cls != core::ValueClass::Batch) continue;
      REQUIRE(routes.count(v) == 1);
      int producer = value.producer == core::kNoNode ? core::kFeederStage : stageOf.at(value.producer);
      REQUIRE(routes[v]->producerStage == producer);
      REQUIRE(std::count(routes[v]->consumerStages.begin(), routes[v]->consumerStages.end(), s.id) == 1);
      crossing += producer >= 0;
    }
  }
  REQUIRE(crossing >= 2);  // at least the hidden state into stages 1 and 2
  // The loss goes back to the caller; token ids come from the feeder without a gradient.
  const core::Route* loss = routes.at(g.outputs()[0]);
  REQUIRE(loss->graphOutput);
  REQUIRE(loss->producerStage == 2);
  const core::Route* ids = routes.at(g.batchInputs()[0]);
  REQUIRE(ids->producerStage == core::kFeederStage);
  REQUIRE_FALSE(ids->carriesGradient);
  for (const core::Route& r : d.routes)
    if (r.producerStage >= 0 && g.value(r.value).type.isTensor() && !r.graphOutput) REQUIRE(r.carriesGradient);
}

TEST_CASE("route verification rejects a missing route", "[decomposer]") {
  Planned p = planSmallBert(2);
  core::Deployment d = p.result.deployment;
  REQUIRE_NOTHROW(verifyDeployment(p.model.graph, d));
  auto crossing = std::find_if(d.routes.begin(), d.routes.end(),
                               [](const core::Route& r) { return r.producerStage == 0; });
  REQUIRE(crossing != d.routes.end());
  d.routes.erase(crossing);
  REQUIRE_THROWS_AS(verifyDeployment(p.model.graph, d), InternalError);
}
