// The planning service (Note [Planning service], Note [Planner store]): a server on a Unix socket
// in a scratch directory, asked through the client, compared with planning in the process.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/proto/cluster_file.h"
#include "core/proto/deployment_file.h"
#include "decomposer/planner.h"
#include "scratch_files.h"
#include "service/plan_call.h"
#include "service/planner_client.h"
#include "service/planner_server.h"
#include "service/planning_core.h"
#include "service_fixtures.h"

namespace autostage::service {
namespace {

using namespace fixtures;  // the tests' model, cluster and place

ServerOptions serverOptions(const Place& place, bool store = true) {
  ServerOptions o;
  o.listen = place.listen;
  o.storeDirectory = store ? place.dir + "/store" : "";
  o.workers = 4;
  return o;
}

// Holds planning (PlanningCore::setPlanHookForTesting) until opened: the first `held` plans
// to arrive wait, later ones pass. Planning made slow by a latch, not by a large model.
class Gate {
 public:
  explicit Gate(int held = INT_MAX) : held_(held) {}
  void pass() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int me = arrived_++;
    changed_.notify_all();
    if (me < held_) changed_.wait(lock, [&] { return open_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  // Waits until n plans arrived; the bound only keeps a failing test from hanging.
  bool waitArrived(int n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::minutes(5), [&] { return arrived_ >= n; });
  }
  int arrived() {
    std::lock_guard<std::mutex> lock(mutex_);
    return arrived_;
  }

 private:
  const int held_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  bool open_ = false;
};

// Opens a gate when the test leaves, so that a failing test does not leave a plan held while the
// service (declared between the gate and this) waits for it.
struct OpenAtExit {
  Gate& gate;
  ~OpenAtExit() { gate.open(); }
};

// Polls until done() (logic, not speed: the bound only keeps a failing test from hanging).
template <typename F>
bool eventually(F&& done) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

TEST_CASE("the service's plan is the local plan, and the second ask comes from the store",
          "[service]") {
  Place place("same_plan");
  Model m = syntheticModel();
  decomposer::PlanResult local =
      decomposer::planGraph(m.graph, m.profile, cluster(4), 32, options());
  PlannerServer server(serverOptions(place));
  PlannerClient client(place.listen);
  proto::PlanCall call = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  proto::PlanAnswer first = client.plan(call, 60);
  CHECK_FALSE(first.from_store());
  CHECK(first.deployment() == core::encodeDeployment(local.deployment));
  CHECK(first.iteration_seconds() == Approx(local.evaluation.iterationSeconds));
  CHECK(first.stages() == 2);
  bool assigned = false;
  for (const std::string& line : first.log())
    assigned |= line.rfind("[Decomposer] [info]  Assigned subgraph", 0) == 0;
  CHECK(assigned);

  proto::PlanAnswer second = client.plan(call, 60);
  CHECK(second.from_store());
  CHECK(second.deployment() == first.deployment());
  CHECK(second.log_size() == first.log_size());

  // By hashes only: the service has both files now.
  proto::PlanCall byHash = call;
  byHash.clear_graph();
  byHash.set_graph_hash(first.graph_hash());
  byHash.clear_profile();
  byHash.set_profile_hash(first.profile_hash());
  CHECK(client.plan(byHash, 60).deployment() == first.deployment());

  // By profile key: a call that sent a profile with a key lets later calls name only the key.
  proto::PlanCall withKey = call;
  withKey.set_profile_key("graph+shapes+profiler options+cpu");
  CHECK(client.plan(withKey, 60).from_store());
  proto::PlanCall keyOnly = withKey;
  keyOnly.clear_profile();
  CHECK(client.plan(keyOnly, 60).deployment() == first.deployment());
  keyOnly.set_profile_key("another model");
  CHECK_THROWS_AS(client.plan(keyOnly, 60), NotStored);

  // Another batch is another plan.
  proto::PlanCall other = call;
  other.set_batch_size(64);
  CHECK_FALSE(client.plan(other, 60).from_store());

  proto::StatusAnswer status = client.status(10);
  CHECK(status.requests() == 7);
  CHECK(status.failed() == 1);
  CHECK(status.plans_made() == 2);
  CHECK(status.store_hits() == 4);
  CHECK(status.hit_rate() == Approx(4.0 / 7));
  CHECK(status.in_flight() == 0);
  CHECK(status.store_entries() == 5);  // one graph, one profile, one key, two plans
  CHECK(status.listen() == place.listen);
}

TEST_CASE("bad calls get errors naming the problem, and the service keeps serving", "[service]") {
  Place place("bad_calls");
  Model m = syntheticModel();
  PlannerServer server(serverOptions(place, false));
  PlannerClient client(place.listen);
  proto::PlanCall good = makePlanCall(m.graph, m.profile, cluster(4), 32, options());

  proto::PlanCall garbage = good;
  garbage.set_graph("not a graph file");
  CHECK_THROWS_AS(client.plan(garbage, 30), FormatError);
  CHECK_THROWS_WITH(client.plan(garbage, 30), Catch::Contains("the call's graph"));

  proto::PlanCall unknownHash = good;
  unknownHash.clear_graph();
  unknownHash.set_graph_hash("0123456789abcdef");
  CHECK_THROWS_WITH(client.plan(unknownHash, 30),
                    Catch::Contains("graph 0123456789abcdef is not in the service's store"));

  proto::PlanCall badKey = good;
  badKey.clear_graph();
  badKey.set_graph_hash("../../etc/passwd");
  CHECK_THROWS_AS(client.plan(badKey, 30), FormatError);

  proto::PlanCall unknownOption = good;
  (*unknownOption.mutable_options())["partition_nmu"] = "2";
  CHECK_THROWS_AS(client.plan(unknownOption, 30), ConfigError);
  CHECK_THROWS_WITH(client.plan(unknownOption, 30),
                    Catch::Contains("'partition_nmu' is not a planner option") &&
                        Catch::Contains("partition_num"));

  proto::PlanCall badValue = good;
  (*badValue.mutable_options())["schedule"] = "zigzag";
  CHECK_THROWS_WITH(client.plan(badValue, 30), Catch::Contains("schedule"));

  proto::PlanCall noBatch = good;
  noBatch.set_batch_size(0);
  CHECK_THROWS_WITH(client.plan(noBatch, 30), Catch::Contains("batch_size must be at least 1"));

  proto::PlanCall tooSmall = makePlanCall(m.graph, m.profile, cluster(2, 1e-6), 32, options());
  CHECK_THROWS_AS(client.plan(tooSmall, 30), PlanError);

  // Still serving, and counting the refusals.
  CHECK(client.plan(good, 60).stages() == 2);
  proto::StatusAnswer status = client.status(10);
  CHECK(status.failed() == 9);
  CHECK(status.plans_made() == 1);
}

TEST_CASE("a call above the request size limit is refused, naming the limit", "[service]") {
  Place place("too_big");
  ServerOptions o = serverOptions(place, false);
  o.maxRequestBytes = 1 << 20;
  PlannerServer server(o);
  PlannerClient client(place.listen);
  proto::PlanCall call;
  call.set_graph(std::string(2 << 20, 'x'));
  CHECK_THROWS_WITH(client.plan(call, 30), Catch::Contains("--max-request-mib"));
  CHECK(client.status(10).requests() == 0);  // refused before it reached a worker
}

TEST_CASE("the store survives a restart, and a corrupt entry is planned again", "[service]") {
  Place place("restart");
  Model m = syntheticModel();
  proto::PlanCall call = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  std::string deployment, key;
  {
    PlannerServer server(serverOptions(place));
    proto::PlanAnswer answer = PlannerClient(place.listen).plan(call, 60);
    deployment = answer.deployment();
    key = answer.plan_key();
  }
  CHECK_FALSE(std::filesystem::exists(place.dir + "/planner.sock"));  // removed at shutdown
  {
    PlannerServer server(serverOptions(place));
    PlannerClient client(place.listen);
    proto::PlanAnswer answer = client.plan(call, 60);
    CHECK(answer.from_store());
    CHECK(answer.deployment() == deployment);
    CHECK(client.status(10).plans_made() == 0);
  }
  fixtures::damageStoredAnswer(place.dir + "/store", key);
  PlannerServer server(serverOptions(place));
  PlannerClient client(place.listen);
  proto::PlanAnswer answer = client.plan(call, 60);
  CHECK_FALSE(answer.from_store());
  CHECK(answer.deployment() == deployment);
  CHECK(PlannerClient(place.listen).plan(call, 60).from_store());  // rewritten
}

TEST_CASE("a second service on a socket in use is refused - a stale socket file is replaced",
          "[service]") {
  Place place("in_use");
  {
    PlannerServer first(serverOptions(place, false));
    CHECK_THROWS_WITH(PlannerServer(serverOptions(place, false)),
                      Catch::Contains("a planning service already listens on"));
    // The first still serves; it answered the second's probe.
    CHECK(PlannerClient(place.listen).status(10).requests() == 1);
  }
  // A socket file nobody listens on (a service that was killed) does not block a new one.
  const std::string path = place.dir + "/planner.sock";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  ::close(fd);
  REQUIRE(std::filesystem::exists(path));
  PlannerServer second(serverOptions(place, false));
  CHECK(PlannerClient(place.listen).status(10).requests() == 0);
}

TEST_CASE("a service that is not there is ServiceUnavailable, quickly", "[service]") {
  Place place("absent");
  PlannerClient client(place.listen);
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(client.status(5), ServiceUnavailable);
  CHECK_THROWS_WITH(client.status(5), Catch::Contains("did not answer"));
  // Bounded by the deadline with a wide margin (10x load), not a speed check.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  CHECK_THROWS_AS(PlannerClient("http://example"), ConfigError);
  CHECK(grpcTarget("tcp:7070") == "127.0.0.1:7070");
  CHECK(grpcTarget("tcp:0.0.0.0:7070") == "0.0.0.0:7070");
  CHECK(grpcTarget("unix:/run/p.sock") == "unix:/run/p.sock");
  CHECK_THROWS_AS(grpcTarget("unix:"), ConfigError);
}

TEST_CASE("concurrent identical calls are planned once", "[service]") {
  Model m = syntheticModel("bert:layers=8,hidden=512,heads=8,seq=128");
  PlanningCore core("");
  proto::PlanCall call = makePlanCall(m.graph, m.profile, cluster(8), 64, options());
  std::vector<proto::PlanAnswer> answers(6);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < answers.size(); ++i)
    threads.emplace_back([&, i] { answers[i] = core.plan(call); });
  for (std::thread& t : threads) t.join();
  CHECK(core.plansMade() == 1);
  int planned = 0;
  for (const proto::PlanAnswer& a : answers) {
    CHECK(a.deployment() == answers[0].deployment());
    planned += !a.from_store();
    // A call that waited for the plan made for another is not planned for, and says so.
    CHECK((!a.joined_in_flight() || a.from_store()));
  }
  CHECK(planned == 1);
  CHECK(core.status().store_hits() == 5);
}

TEST_CASE("WhatIf plans every point of the sweep, or says why it does not fit", "[service]") {
  Model m = syntheticModel();
  PlanningCore core("");
  proto::WhatIfCall call;
  *call.mutable_base() =
      makePlanCall(m.graph, m.profile, cluster(4), 32, decomposer::PlanOptions());
  for (int n : {2, 4}) call.add_devices(n);
  for (double gib : {1e-6, 16.0}) call.add_device_memory_gib(gib);
  call.add_batch_sizes(32);
  for (const char* s : {"gpipe", "1f1b"}) call.add_schedules(s);
  proto::WhatIfAnswer answer = core.whatIf(call);
  REQUIRE(answer.points_size() == 8);
  for (const proto::WhatIfPoint& p : answer.points()) {
    INFO(p.devices() << " devices, " << p.device_memory_gib() << " GiB, " << p.schedule_option());
    CHECK(p.feasible() == (p.device_memory_gib() > 1));
    if (!p.feasible()) {
      CHECK(p.error().find("memory") != std::string::npos);
      continue;
    }
    decomposer::PlanOptions o;
    o.schedule = p.schedule_option();
    decomposer::PlanResult direct =
        decomposer::planGraph(m.graph, m.profile, cluster(p.devices()), 32, o);
    CHECK(p.iteration_seconds() == Approx(direct.evaluation.iterationSeconds));
    CHECK(p.stages() == static_cast<int>(direct.deployment.stages.size()));
    CHECK(p.schedule() == direct.deployment.schedule);
  }
}

TEST_CASE("Neighbours plans the other device counts in the background", "[service]") {
  Place place("neighbours");
  Model m = syntheticModel();
  PlannerServer server(serverOptions(place));
  PlannerClient client(place.listen);
  proto::NeighboursCall call;
  *call.mutable_base() = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  call.set_spread(1);
  proto::NeighboursAnswer queued = client.neighbours(call, 30);
  REQUIRE(queued.queued_size() == 2);
  CHECK(queued.queued(0) == 3);
  CHECK(queued.queued(1) == 5);
  // Wait for the background plans (logic, not speed: the bound only avoids hanging).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (server.core().plansMade() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(server.core().plansMade() == 2);
  proto::PlanCall five = call.base();
  core::ClusterSpec fiveDevices = cluster(5);
  fiveDevices.devicesPerNode = 4;  // the base's node layout, as a job grown by one rank has
  five.set_cluster(core::encodeClusterSpec(fiveDevices));
  CHECK(client.plan(five, 60).from_store());
  call.set_spread(0);
  CHECK_THROWS_WITH(client.neighbours(call, 30), Catch::Contains("spread must be in [1, 64]"));
}

TEST_CASE("a Plan call whose deadline passes returns - its plan goes on and is stored",
          "[service]") {
  Place place("deadline");
  Model m = syntheticModel();
  proto::PlanCall call = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  const std::string local = core::encodeDeployment(
      decomposer::planGraph(m.graph, m.profile, cluster(4), 32, options()).deployment);
  Gate gate(/*held=*/1);  // the first plan waits until the gate opens
  PlannerServer server(serverOptions(place));
  OpenAtExit openAtExit{gate};
  server.core().setPlanHookForTesting([&] { gate.pass(); });
  PlannerClient client(place.listen);

  CHECK_THROWS_AS(client.plan(call, 0.5), ServiceUnavailable);  // the client's deadline
  REQUIRE(gate.waitArrived(1));
  // The server's handler returned too (a failed request, none in flight) while the plan is held.
  REQUIRE(eventually([&] { return client.status(30).failed() == 1; }));
  proto::StatusAnswer status = client.status(30);
  CHECK(status.in_flight() == 0);
  CHECK(status.plans_made() == 0);
  // An identical call waits for the same plan, and returns at its own deadline.
  CHECK_THROWS_AS(client.plan(call, 0.3), ServiceUnavailable);
  REQUIRE(eventually([&] { return client.status(30).failed() == 2; }));
  // Meanwhile the service answers other calls.
  proto::PlanCall other = call;
  other.set_batch_size(64);
  CHECK_FALSE(client.plan(other, 120).from_store());
  CHECK(client.plan(other, 120).from_store());

  gate.open();
  REQUIRE(eventually([&] { return server.core().plansMade() == 2; }));
  proto::PlanAnswer again = client.plan(call, 120);
  CHECK(again.from_store());
  CHECK(again.deployment() == local);
  CHECK(gate.arrived() == 2);  // the held plan was made once, for both calls that left
  CHECK(server.core().plansMade() == 2);
}

TEST_CASE("a service stopped while a plan whose caller left is made stores it before it exits",
          "[service]") {
  Place place("stop_while_planning");
  Model m = syntheticModel();
  proto::PlanCall call = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  Gate gate;
  {
    auto server = std::make_unique<PlannerServer>(serverOptions(place));
    OpenAtExit openAtExit{gate};
    server->core().setPlanHookForTesting([&] { gate.pass(); });
    CHECK_THROWS_AS(PlannerClient(place.listen).plan(call, 0.5), ServiceUnavailable);
    REQUIRE(gate.waitArrived(1));
    std::thread stopping([&] { server.reset(); });  // waits for the held plan
    gate.open();
    stopping.join();
  }
  PlannerServer server(serverOptions(place));
  CHECK(PlannerClient(place.listen).plan(call, 60).from_store());
}

TEST_CASE("a call planning longer than --max-plan-s fails, naming the flag - the plan is stored",
          "[service]") {
  Place place("max_plan_s");
  Model m = syntheticModel();
  proto::PlanCall call = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  Gate gate;
  ServerOptions o = serverOptions(place);
  o.maxPlanSeconds = 0.2;  // far below the client's 120 s: the service's limit comes first
  PlannerServer server(o);
  OpenAtExit openAtExit{gate};
  server.core().setPlanHookForTesting([&] { gate.pass(); });
  PlannerClient client(place.listen);
  CHECK_THROWS_AS(client.plan(call, 120), ServiceUnavailable);
  CHECK_THROWS_WITH(client.plan(call, 120),
                    Catch::Contains("--max-plan-s") && Catch::Contains("0.2 s"));
  gate.open();
  REQUIRE(eventually([&] { return server.core().plansMade() == 1; }));
  CHECK(client.plan(call, 120).from_store());
  CHECK(gate.arrived() == 1);
}

TEST_CASE("a caller that leaves stops its wait - a plan beyond the workers waits for one",
          "[service]") {
  Model m = syntheticModel();
  Gate gate(/*held=*/1);
  PlanningOptions o;
  o.maxConcurrentPlans = 1;
  PlanningCore core(o);
  OpenAtExit openAtExit{gate};
  core.setPlanHookForTesting([&] { gate.pass(); });
  proto::PlanCall call = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  // Runs core.plan(c) on a thread until `gone`; its answer or the error it ended with. Leaves
  // and is joined when the test ends, also when a check failed.
  struct Caller {
    ~Caller() {
      gone = true;
      if (thread.joinable()) thread.join();
    }
    std::atomic<bool> gone{false};
    std::exception_ptr error;
    std::optional<proto::PlanAnswer> answer;
    std::thread thread;
    void start(PlanningCore& core, const proto::PlanCall& c) {
      thread = std::thread([this, &core, c] {
        try {
          answer = core.plan(c, [this] {
            return gone ? CallerState::kCancelled : CallerState::kWaiting;
          });
        } catch (...) {
          error = std::current_exception();
        }
      });
    }
  };
  Caller first;
  first.start(core, call);
  REQUIRE(gate.waitArrived(1));
  first.gone = true;
  first.thread.join();  // returns although the plan is held
  REQUIRE(first.error);
  CHECK_THROWS_AS(std::rethrow_exception(first.error), CallCancelled);
  // The held plan takes the one worker: another plan waits for it without starting, and its
  // caller may leave meanwhile, leaving nothing behind.
  proto::PlanCall other = call;
  other.set_batch_size(64);
  Caller leaving;
  leaving.start(core, other);
  REQUIRE(eventually([&] { return core.status().waiting_for_worker() == 1; }));
  leaving.gone = true;
  leaving.thread.join();
  REQUIRE(leaving.error);
  CHECK_THROWS_WITH(std::rethrow_exception(leaving.error),
                    Catch::Contains("waited for one of the service's --workers"));
  CHECK(core.status().waiting_for_worker() == 0);
  CHECK(gate.arrived() == 1);
  // One that stays is planned when the worker is free; an identical call joins the held plan.
  Caller staying;
  staying.start(core, other);
  REQUIRE(eventually([&] { return core.status().waiting_for_worker() == 1; }));
  gate.open();
  CHECK(core.plan(call).from_store());
  staying.thread.join();
  REQUIRE_FALSE(staying.error);
  REQUIRE(staying.answer);
  CHECK_FALSE(staying.answer->from_store());
  CHECK(core.plansMade() == 2);
  CHECK(gate.arrived() == 2);  // the caller that left started no plan
  CHECK(core.status().waiting_for_worker() == 0);
}

TEST_CASE("a WhatIf sweep whose caller left stops between points", "[service]") {
  Model m = syntheticModel();
  Gate gate;  // every point waits
  PlanningCore core("");
  OpenAtExit openAtExit{gate};
  core.setPlanHookForTesting([&] { gate.pass(); });
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  proto::WhatIfCall call;
  *call.mutable_base() = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  const int points = 4 * threads + 8;
  for (int i = 1; i <= points; ++i) call.add_batch_sizes(8 * i);
  std::atomic<bool> gone{false};
  std::atomic<int> toldGone{0};
  auto caller = [&] {
    if (!gone) return CallerState::kWaiting;
    ++toldGone;
    return CallerState::kDeadlinePassed;
  };
  std::exception_ptr error;
  std::thread sweeping([&] {
    try {
      core.whatIf(call, caller);
    } catch (...) {
      error = std::current_exception();
    }
  });
  REQUIRE(gate.waitArrived(threads));  // every thread holds a point
  gone = true;
  REQUIRE(eventually([&] { return toldGone > 0; }));  // the sweep was told; now let points finish
  gate.open();
  sweeping.join();
  REQUIRE(error);
  CHECK_THROWS_AS(std::rethrow_exception(error), DeadlineExceeded);
  // The points being planned finished and no thread took another: the poller ends the sweep
  // while no point can be taken (it failed once in a loaded ctest run when threads could take
  // points between the caller saying it left and the sweep stopping).
  CHECK(gate.arrived() == threads);
  CHECK(gate.arrived() < points);
}

TEST_CASE("above --store-max-mib the least recently used plans go, and are planned again",
          "[service]") {
  Place place("eviction");
  Model m = syntheticModel();
  // The sizes of this model's entries: graph and profile, and one plan answer.
  int64_t base = 0, plan = 0;
  std::string deploymentB;
  {
    PlannerServer server(serverOptions(place));
    proto::PlanAnswer a = PlannerClient(place.listen).plan(planCall(m, 32), 60);
    base = server.core().store().bytes();
    plan = static_cast<int64_t>(
        std::filesystem::file_size(place.dir + "/store/plans/" + a.plan_key() + ".answer"));
    REQUIRE(base > plan);
  }
  // Room for the graph, the profile and 3.5 plans (Note [Store eviction]: a put above it goes
  // down to 90%, which holds them and 2 plans, as the sizes of this model are).
  ServerOptions o = serverOptions(place);
  o.storeMaxBytes = base + plan * 5 / 2;
  proto::StatusAnswer reopened;
  {
    PlannerServer server(o);
    PlannerClient client(place.listen);
    CHECK(client.status(30).store_bytes() == base);  // measured again at start
    proto::PlanAnswer b = client.plan(planCall(m, 64), 60);
    deploymentB = b.deployment();
    CHECK_FALSE(client.plan(planCall(m, 96), 60).from_store());
    CHECK(client.status(30).store_evictions() == 0);
    // A use: 32 is now more recent than 64 and 96.
    CHECK(client.plan(planCall(m, 32), 60).from_store());
    CHECK_FALSE(client.plan(planCall(m, 128), 60).from_store());  // above the limit
    proto::StatusAnswer status = client.status(30);
    CHECK(status.store_evictions() == 2);  // the plans for 64 and 96, the least recently used
    CHECK(status.store_bytes() <= o.storeMaxBytes);
    CHECK(status.store_max_bytes() == o.storeMaxBytes);
    CHECK(client.plan(planCall(m, 32), 60).from_store());
    CHECK(client.plan(planCall(m, 128), 60).from_store());       // the one just written stayed
    proto::PlanAnswer again = client.plan(planCall(m, 64), 60);  // evicted: planned again
    CHECK_FALSE(again.from_store());
    CHECK(again.deployment() == deploymentB);
    CHECK(client.plan(planCall(m, 64), 60).from_store());
    // The graph and profile were used by every call: still there, for calls by hash.
    proto::PlanCall byHash = planCall(m, 32);
    byHash.clear_graph();
    byHash.set_graph_hash(again.graph_hash());
    byHash.clear_profile();
    byHash.set_profile_hash(again.profile_hash());
    CHECK(client.plan(byHash, 60).from_store());
    reopened = client.status(30);
  }
  // A restarted service measures the store again and reports the same size.
  PlannerServer server(o);
  PlannerClient client(place.listen);
  proto::StatusAnswer status = client.status(30);
  CHECK(status.store_bytes() == reopened.store_bytes());
  CHECK(status.store_entries() == reopened.store_entries());
  CHECK(status.store_evictions() == 0);
  CHECK(client.plan(planCall(m, 64), 60).from_store());
}

TEST_CASE("a profile or graph evicted from the store is asked for again, not dangling",
          "[service]") {
  Place place("evicted_inputs");
  Model m = syntheticModel();
  proto::PlanCall call = makePlanCall(m.graph, m.profile, cluster(4), 32, options());
  call.set_profile_key("evicted profile key");
  ServerOptions o = serverOptions(place);
  {
    PlannerServer server(o);
    PlannerClient(place.listen).plan(call, 60);
  }
  // The graph and profile files go (as an eviction removes them), the answer and the key stay.
  for (const char* kind : {"graphs", "profiles"})
    for (const auto& entry : std::filesystem::directory_iterator(place.dir + "/store/" + kind))
      std::filesystem::remove(entry.path());
  PlannerServer server(o);
  PlannerClient client(place.listen);
  proto::PlanCall keyOnly = call;
  keyOnly.clear_profile();
  CHECK_THROWS_AS(client.plan(keyOnly, 60), NotStored);  // the job profiles and sends it
  CHECK_THROWS_WITH(client.plan(keyOnly, 60), Catch::Contains("evicted"));
  proto::PlanAnswer sent = client.plan(call, 60);  // the files sent again: stored again
  CHECK(sent.from_store());                        // the answer itself did not need them
  CHECK(client.plan(keyOnly, 60).from_store());
  proto::PlanCall byHash = keyOnly;
  byHash.clear_profile_key();
  byHash.clear_graph();
  byHash.set_graph_hash(sent.graph_hash());
  byHash.set_profile_hash(sent.profile_hash());
  CHECK(client.plan(byHash, 60).from_store());
}

}  // namespace
}  // namespace autostage::service
