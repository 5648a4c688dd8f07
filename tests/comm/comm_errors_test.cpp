// Timeouts, mismatches and bad input: errors name the rank, the peer or group and what to do.
#include "catch_torch.h"

#include "comm/registry.h"
#include "comm/thread_backend.h"
#include "comm_test_util.h"
#include "core/config.h"
#include "core/error.h"

using namespace autostage;
using namespace autostage::comm;
using testing::errorOf;
using testing::firstError;

namespace {
CommOptions shortTimeout() {
  CommOptions options;
  options.timeoutSeconds = 0.3;
  return options;
}
}  // namespace

TEST_CASE("a recv from a rank that never sends fails naming that rank", "[comm]") {
  auto errors = runThreadRanks(
      3,
      [](ThreadBackend& backend) {
        if (backend.rank() == 0) backend.recv(at::empty({4}), 2, 5);
      },
      shortTimeout());
  REQUIRE(errors[1] == nullptr);
  REQUIRE(errors[2] == nullptr);
  REQUIRE_THROWS_AS(std::rethrow_exception(errors[0]), CommError);
  REQUIRE_THAT(errorOf(errors, 0),
               Catch::StartsWith("rank 0 waited 0.3 s for a tensor from rank 2 (tag 5, recv)") &&
                   Catch::Contains("comm_timeout_s"));
}

TEST_CASE("a collective a member never joins fails naming the missing member", "[comm]") {
  auto errors = runThreadRanks(
      3,
      [](ThreadBackend& backend) {
        at::Tensor t = at::ones({2});
        if (backend.rank() != 1) backend.allReduce(t, ReduceOp::Sum, backend.world());
      },
      shortTimeout());
  // The leader (rank 0) waits for rank 1; rank 2 waits for the leader's result.
  REQUIRE_THAT(errorOf(errors, 0),
               Catch::StartsWith("rank 0 waited 0.3 s for rank 1 (allReduce over group {0,1,2})"));
  REQUIRE_THAT(errorOf(errors, 2),
               Catch::StartsWith("rank 2 waited 0.3 s for rank 0 (allReduce over group {0,1,2})"));
  REQUIRE(errorOf(errors, 1) == "");

  auto irecvErrors = runThreadRanks(
      2,
      [](ThreadBackend& backend) {
        if (backend.rank() == 1) backend.irecv(at::empty({1}), 0, 9)->wait();
      },
      shortTimeout());
  REQUIRE_THAT(errorOf(irecvErrors, 1),
               Catch::StartsWith("rank 1 waited 0.3 s for a tensor from rank 0 (tag 9, irecv)"));
}

TEST_CASE("a received message of another dtype or size is a CommError naming both", "[comm]") {
  auto errors = runThreadRanks(2, [](ThreadBackend& backend) {
    if (backend.rank() == 0)
      backend.send(at::ones({3}, at::kFloat), 1, 0);
    else
      backend.recv(at::empty({3}, at::kLong), 0, 0);
  });
  REQUIRE_THAT(errorOf(errors, 1),
               Catch::Contains("expected Long[3]") && Catch::Contains("sent Float"));
}

TEST_CASE("bad arguments are rejected before anything is sent", "[comm]") {
  auto errors = runThreadRanks(2, [](ThreadBackend& backend) {
    if (backend.rank() != 0) return;
    auto expectThrow = [&](const std::function<void()>& call, const std::string& text) {
      try {
        call();
      } catch (const Error& e) {
        if (std::string(e.what()).find(text) != std::string::npos) return;
        throw InternalError("message '" + std::string(e.what()) + "' lacks '" + text + "'");
      }
      throw InternalError("no error for a call expected to fail with '" + text + "'");
    };
    at::Tensor t = at::ones({4, 4});
    expectThrow([&] { backend.send(t.t(), 1, 0); }, "call .contiguous()");
    expectThrow([&] { backend.send(t, 2, 0); }, "outside the world of size 2");
    expectThrow([&] { backend.send(t, 0, 0); }, "the peer is this rank itself");
    expectThrow([&] { backend.send(t, 1, -1); }, "tag must be >= 0");
    expectThrow([&] { backend.send(at::ones({2}, at::kComplexFloat), 1, 0); }, "not supported");
    expectThrow(
        [&] { backend.allReduce(at::ones({2}, at::kLong), ReduceOp::Average, backend.world()); },
        "needs a floating-point tensor");
    expectThrow([&] { backend.allReduce(t, ReduceOp::Sum, Group({1})); }, "not a member");
    expectThrow([&] { backend.broadcast(t, 1, Group({0})); }, "root rank 1 is not a member");
    expectThrow([&] { backend.barrier(Group({0, 5})); }, "outside the world of size 2");
  });
  REQUIRE(firstError(errors) == "");
}

TEST_CASE("groups are sorted unique rank sets", "[comm]") {
  Group group({3, 1});
  REQUIRE(group.ranks() == std::vector<int>{1, 3});
  REQUIRE(group.toString() == "{1,3}");
  REQUIRE(group.indexOf(3) == 1);
  REQUIRE(group.indexOf(2) == -1);
  REQUIRE(group.leader() == 1);
  REQUIRE(Group::world(3) == Group({0, 1, 2}));
  REQUIRE_THROWS_WITH(Group({}), Catch::Contains("at least one rank"));
  REQUIRE_THROWS_WITH(Group({1, 2, 1}), Catch::Contains("rank 1 appears twice in {1,1,2}"));
  REQUIRE_THROWS_WITH(Group({-1, 2}), Catch::Contains(">= 0"));
}

TEST_CASE("registry lists known backends and picks MPI for CPU tensors", "[comm]") {
  registerBuiltinBackends();
  std::vector<std::string> names = knownBackends();
  REQUIRE(std::find(names.begin(), names.end(), "mpi") != names.end());
  REQUIRE_THROWS_AS(createBackend("gloo"), ConfigError);
  REQUIRE_THROWS_WITH(createBackend("gloo"), Catch::Contains("unknown comm backend 'gloo'") &&
                                                 Catch::Contains("known backends: ") &&
                                                 Catch::Contains("mpi"));
  REQUIRE(backendNameFor(at::ones({1})) == "mpi");
  registerBackend("threads-1", [] {
    return std::make_shared<ThreadBackend>(std::make_shared<ThreadWorld>(1, CommOptions()), 0);
  });
  REQUIRE(createBackend("threads-1")->name() == "thread");
  REQUIRE(sharedBackend("threads-1") == sharedBackend("threads-1"));
}

TEST_CASE("comm options come from comm_timeout_s and are validated", "[comm]") {
  core::Config config;
  REQUIRE(config.getFloat("comm_timeout_s") == 60.0);
  REQUIRE(CommOptions::fromConfig().timeoutSeconds ==
          core::globalConfig().getFloat("comm_timeout_s"));
  CommOptions options;
  options.timeoutSeconds = 0;
  REQUIRE_THROWS_AS(options.validate(), ConfigError);
  REQUIRE_THROWS_WITH(options.validate(), Catch::Contains("AUTOSTAGE_COMM_TIMEOUT_S"));
  REQUIRE_THROWS_AS(ThreadWorld(2, options), ConfigError);
  options.timeoutSeconds = 2.5;
  REQUIRE(options.toString() == "CommOptions(timeout=2.5 s)");
}
