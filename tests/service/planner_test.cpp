// Note [One planner]: the local, remote and fallback planners answer a plan call alike; the
// local one keeps its answers and profiles in its store across processes (plan_cache_dir); the
// fallback asks the service, and plans locally only when the service does not answer.
#include "service/planner.h"

#include <catch2/catch.hpp>
#include <string>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/proto/deployment_file.h"
#include "decomposer/planner.h"
#include "service/planner_server.h"
#include "service_fixtures.h"

namespace autostage::service {
namespace {

using namespace fixtures;

// The call by profile key only, as a relaunched job makes it first.
proto::PlanCall byKey(const Model& m, const std::string& key) {
  proto::PlanCall call = makePlanCall(m.graph, nullptr, cluster(4), 32, options());
  call.set_profile_key(key);
  return call;
}

TEST_CASE("the local planner plans as the decomposer does and keeps it in its store",
          "[service]") {
  Place place("local_planner");
  Model m = syntheticModel();
  const decomposer::PlanResult direct =
      decomposer::planGraph(m.graph, m.profile, cluster(4), 32, options());
  proto::PlanCall call = planCall(m, 32);
  call.set_profile_key("model A");
  std::string planKey;
  {
    std::unique_ptr<Planner> planner = makeLocalPlanner(place.dir + "/store");
    CHECK_THROWS_AS(planner->plan(byKey(m, "model A")), NotStored);  // nothing kept yet
    core::LogCapture capture(/*echo=*/false);
    const proto::PlanAnswer answer = planner->plan(call);
    CHECK_FALSE(answer.from_store());
    CHECK(answer.deployment() == core::encodeDeployment(direct.deployment));
    CHECK(answer.graph_nodes() == static_cast<int64_t>(m.graph.nodeCount()));
    CHECK(answer.phases_size() > 0);
    planKey = answer.plan_key();
    bool saved = false;
    for (const std::string& line : capture.lines())
      saved |= line.find("Plan " + planKey + " saved in the plan store at") != std::string::npos;
    CHECK(saved);
  }
  // Another process over the same store (a relaunch): by the profile key alone, from the store.
  std::unique_ptr<Planner> planner = makeLocalPlanner(place.dir + "/store");
  core::LogCapture capture(/*echo=*/false);
  const proto::PlanAnswer again = planner->plan(byKey(m, "model A"));
  CHECK(again.from_store());
  CHECK(again.plan_key() == planKey);
  CHECK(again.deployment() == core::encodeDeployment(direct.deployment));
  bool replayed = false, fromStore = false;
  for (const std::string& line : capture.lines()) {
    replayed |= line.find("Assigned subgraph") != std::string::npos;
    fromStore |= line.find("from the plan store at") != std::string::npos;
  }
  CHECK(replayed);  // the partition log of the stored plan
  CHECK(fromStore);
  CHECK_THROWS_AS(planner->plan(byKey(m, "model B")), NotStored);
}

TEST_CASE("the fallback planner asks the service, and plans locally when it does not answer",
          "[service]") {
  Place place("fallback_planner");
  Model m = syntheticModel();
  const proto::PlanCall call = planCall(m, 32);
  core::Config config;
  config.set("planner_address", place.listen, "test");
  config.set("planner_timeout_s", "20", "test");
  {
    PlannerServer server(ServerOptions{place.listen, place.dir + "/served", 2});
    std::unique_ptr<Planner> planner = makePlanner(config);
    const proto::PlanAnswer answer = planner->plan(call);
    CHECK_FALSE(answer.from_store());
    CHECK(planner->where() == "the planning service at " + place.listen);
    CHECK(planner->plan(call).from_store());  // the service's store
    // What the service answers is the answer: nothing fits here either.
    proto::PlanCall tiny = makePlanCall(m.graph, m.profile, cluster(4, 1e-6), 32, options());
    CHECK_THROWS_AS(planner->plan(tiny), PlanError);
    CHECK(planner->where() == "the planning service at " + place.listen);
  }
  // The service is gone: this process plans, and keeps doing so without asking again.
  std::unique_ptr<Planner> planner = makePlanner(config);
  core::LogCapture capture(/*echo=*/false);
  const proto::PlanAnswer local = planner->plan(call);
  CHECK_FALSE(local.from_store());
  CHECK(planner->where() == "this process");
  bool said = false;
  for (const std::string& line : capture.lines())
    said |= line.find("did not answer") != std::string::npos &&
            line.find("planning locally (this process) from now on") != std::string::npos;
  CHECK(said);
  CHECK(planner->plan(call).from_store());  // this process's own memory
}

}  // namespace
}  // namespace autostage::service
