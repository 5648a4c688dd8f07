#include "profiler/comm_profile.h"

#include "catch_torch.h"

#include <mutex>

#include "comm/thread_backend.h"
#include "core/config.h"
#include "core/error.h"

using namespace autostage;
using namespace autostage::profiler;

namespace {

CommProfileOptions smallSizes() {
  CommProfileOptions options;
  options.minBytes = 1024;
  options.maxBytes = 256 * 1024;
  options.repeats = 2;
  return options;
}

void rethrowFirst(const std::vector<std::exception_ptr>& errors) {
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// profileComm (small sizes) on `ranks` thread ranks, rank r on host hostOf(r); each rank's result.
std::vector<core::CommProfile> profileOnThreadRanks(int ranks, std::string (*hostOf)(int)) {
  std::vector<core::CommProfile> results(ranks);
  rethrowFirst(comm::runThreadRanks(ranks, [&](comm::ThreadBackend& backend) {
    CommProfileOptions options = smallSizes();
    options.hostName = hostOf(backend.rank());
    results[backend.rank()] = profileComm(&backend, options);
  }));
  return results;
}

std::string oneHost(int) { return "same"; }

}  // namespace

TEST_CASE("link fit recovers latency and bandwidth", "[profiler]") {
  std::vector<double> bytes = {1e3, 1e4, 1e5, 1e6}, seconds;
  for (double b : bytes) seconds.push_back(5e-6 + b / 2e9);
  core::LinkCost link = fitLink(bytes, seconds);
  CHECK(link.latencySeconds == Approx(5e-6).epsilon(1e-6));
  CHECK(link.bytesPerSecond == Approx(2e9).epsilon(1e-6));
}

TEST_CASE("one rank falls back to the configured communication costs", "[profiler]") {
  const core::Config& config = core::globalConfig();
  core::CommProfile profile = profileComm(nullptr);
  CHECK_FALSE(profile.measured);
  CHECK(profile.p2pInterNode.bytesPerSecond == config.getFloat("comm_bandwidth"));
  CHECK(profile.p2pIntraNode.latencySeconds == config.getFloat("comm_latency"));
  CHECK(profile.allreduceIntraNode.bytesPerSecond == config.getFloat("allreduce_bandwidth"));
  CHECK(profile == configuredCommProfile());
  CommProfileOptions bad;
  bad.maxBytes = 10;
  CHECK_THROWS_AS(profileComm(nullptr, bad), ConfigError);
}

TEST_CASE("four thread ranks on two hosts measure intra and inter links alike everywhere",
          "[profiler][comm]") {
  const std::vector<core::CommProfile> results =
      profileOnThreadRanks(4, [](int rank) { return std::string(rank < 2 ? "hostA" : "hostB"); });
  const core::CommProfile configured = configuredCommProfile();
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(results[r].measured);
    CHECK(results[r] == results[0]);  // every rank got rank 0's fits
  }
  const core::CommProfile& p = results[0];
  for (const core::LinkCost* link : {&p.p2pIntraNode, &p.p2pInterNode, &p.allreduceIntraNode,
                                     &p.allreduceInterNode}) {
    CHECK(link->latencySeconds >= 0);
    CHECK(link->bytesPerSecond > 0);
    CHECK_FALSE(*link == configured.p2pIntraNode);  // measured, not the fallback
  }
  CHECK(p.allreduceGroups.empty());  // 2 ranks per host: the intra-node all-reduce is the group's
}

TEST_CASE("eight ranks on one host measure the all-reduces of tensor-parallel groups of 2 and 4",
          "[profiler][comm]") {
  const std::vector<core::CommProfile> results = profileOnThreadRanks(8, oneHost);
  const core::CommProfile& p = results[0];
  for (int r = 0; r < 8; ++r) CHECK(results[r] == p);
  REQUIRE(p.allreduceGroups.size() == 2);
  for (int n : {2, 4}) {
    INFO("group of " << n);
    REQUIRE(p.allreduceGroups.count(n));
    const core::LinkCost& link = p.allreduceGroups.at(n);
    CHECK(link.latencySeconds >= 0);
    CHECK(link.bytesPerSecond > 0);
    CHECK(&p.allreduceWithinNode(n) == &link);
  }
  CHECK(&p.allreduceWithinNode(8) == &p.allreduceIntraNode);  // the whole node's
}

TEST_CASE("two ranks on one host keep the configured inter-node costs", "[profiler][comm]") {
  const std::vector<core::CommProfile> results = profileOnThreadRanks(2, oneHost);
  const core::CommProfile configured = configuredCommProfile();
  CHECK(results[0].measured);
  CHECK(results[0].p2pInterNode == configured.p2pInterNode);
  CHECK(results[0].allreduceInterNode == configured.allreduceInterNode);
  CHECK_FALSE(results[0].p2pIntraNode == configured.p2pIntraNode);
  CHECK_FALSE(results[0].allreduceIntraNode == configured.allreduceIntraNode);
}
