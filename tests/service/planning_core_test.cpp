// Answers from memory (Note [Answers from memory]): the planning core serves a stored answer from
// the copy it verified once, exactly as stored; follows the store when an entry changes (a
// profile key sent with another profile, an answer found damaged); and, with no memory, reads
// and verifies the store on every call as before.
#include "service/planning_core.h"

#include <sys/stat.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/ir/graph.h"
#include "service/plan_call.h"
#include "service_fixtures.h"

namespace autostage::service {
namespace {

using namespace fixtures;  // the tests' model, cluster and place

PlanningOptions storeIn(const Place& place) {
  PlanningOptions o;
  o.storeDirectory = place.dir + "/store";
  o.maxConcurrentPlans = 2;
  return o;
}

TEST_CASE("a stored answer from memory is the answer as stored, before and after a restart",
          "[service]") {
  Place place("memory_answers");
  Model m = syntheticModel();
  const proto::PlanCall call = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  std::string stored;
  {
    PlanningCore core(storeIn(place));
    proto::PlanAnswer planned = core.plan(call);
    REQUIRE_FALSE(planned.from_store());
    proto::PlanAnswer answer = core.plan(call);  // the copy made when the plan was stored
    CHECK(answer.from_store());
    planned.set_from_store(true);
    CHECK(answer.SerializeAsString() == planned.SerializeAsString());
    stored = answer.SerializeAsString();
    // Kept as verified: a file damaged while the core runs is found at the next start.
    damageStoredAnswer(place.dir + "/store", answer.plan_key());
    CHECK(core.plan(call).SerializeAsString() == stored);
    CHECK(core.plansMade() == 1);
  }
  {
    PlanningCore core(storeIn(place));
    proto::PlanAnswer replanned = core.plan(call);  // refused by name, planned again
    CHECK_FALSE(replanned.from_store());
    CHECK(core.plansMade() == 1);
    replanned.set_from_store(true);
    stored = replanned.SerializeAsString();  // its planning time differs from the first one's
  }
  PlanningCore core(storeIn(place));  // a fresh memory: read and verified once, then kept
  CHECK(core.plan(call).SerializeAsString() == stored);
  CHECK(core.plan(call).SerializeAsString() == stored);
  CHECK(core.plansMade() == 0);
}

TEST_CASE("without memory every stored answer is read and verified again", "[service]") {
  Place place("no_memory");
  Model m = syntheticModel();
  const proto::PlanCall call = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  PlanningOptions o = storeIn(place);
  o.memoryBytes = 0;
  PlanningCore core(o);
  const proto::PlanAnswer planned = core.plan(call);
  CHECK(core.plan(call).from_store());
  damageStoredAnswer(place.dir + "/store", planned.plan_key());
  const proto::PlanAnswer again = core.plan(call);
  CHECK_FALSE(again.from_store());
  CHECK(again.deployment() == planned.deployment());
  CHECK(core.plan(call).from_store());
  CHECK(core.plansMade() == 2);
}

// The inode of a store file: a rewrite (through a temporary file and a rename) changes it.
ino_t inodeOf(const std::string& path) {
  struct stat info {};
  REQUIRE(::stat(path.c_str(), &info) == 0);
  return info.st_ino;
}

TEST_CASE("a profile key sent with another profile is followed by calls naming only the key",
          "[service]") {
  Place place("profile_key_replaced");
  Model m = syntheticModel();
  core::GraphProfile recalibrated = m.profile;
  recalibrated.calibration = 1.5;
  proto::PlanCall first = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  first.set_profile_key("model on cpu");
  proto::PlanCall second = makePlanCall(m.graph, recalibrated, cluster(4), 32, options());
  second.set_profile_key("model on cpu");
  proto::PlanCall keyOnly = first;
  keyOnly.clear_profile();
  PlanningCore core(storeIn(place));
  const std::string a = core.plan(first).profile_hash();
  CHECK(core.plan(keyOnly).profile_hash() == a);  // kept in memory now
  const std::string keyFile =
      place.dir + "/store/profile-keys/" + core::fnv1aHex("model on cpu") + ".key";
  const ino_t written = inodeOf(keyFile);
  core.plan(first);  // the same profile again: the key is not written again
  CHECK(inodeOf(keyFile) == written);
  const std::string b = core.plan(second).profile_hash();
  REQUIRE(b != a);
  CHECK(core.plan(keyOnly).profile_hash() == b);
  CHECK(core.plan(first).profile_hash() == a);
  CHECK(core.plan(keyOnly).profile_hash() == a);
}

TEST_CASE("calls answered from memory while other plans are stored get their own answers",
          "[service]") {
  Place place("memory_concurrent");
  Model m = syntheticModel();
  PlanningCore core(storeIn(place));
  const std::string expected = core.plan(planCall(m, 32)).deployment();
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      const proto::PlanCall call = planCall(m, 32);
      for (int i = 0; i < 50; ++i) {
        const proto::PlanAnswer answer = core.plan(call);
        if (!answer.from_store() || answer.deployment() != expected) ++wrong;
      }
    });
  }
  for (int64_t batch : {40, 48, 56, 64}) core.plan(planCall(m, batch));  // stored meanwhile
  for (std::thread& t : readers) t.join();
  CHECK(wrong == 0);
  CHECK(core.plansMade() == 5);
}

}  // namespace
}  // namespace autostage::service
