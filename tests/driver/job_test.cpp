// Note [Resolving the job], the plan cache key built from it, and Note [One agreement per call].
#include "driver/job.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>  // last: glog's CHECK must not replace Catch2's (NOTES-libtorch.md)

#include "comm/thread_backend.h"
#include "core/config.h"
#include "core/error.h"
#include "driver/module.h"
#include "driver/plan_cache.h"
#include "test_support.h"

namespace autostage::driver {
namespace {

TEST_CASE("the job: ranks per node from the backend, memory resolved once", "[driver]") {
  core::Config config;
  std::vector<JobSpec> jobs(3);
  staging::testing::rethrowFirst(comm::runThreadRanks(
      3, [&](comm::ThreadBackend& b) { jobs[b.rank()] = resolveJob(b, config); }));
  const JobSpec& job = jobs[0];
  CHECK(job.worldSize == 3);
  CHECK(job.ranksPerNode == 3);  // thread ranks share one process
  CHECK(job.deviceKind == "cpu");
  REQUIRE(job.nodeMemory > 0);
  CHECK(job.memoryLimit == 0);
  CHECK(job.deviceMemory() == job.nodeMemory / 3);
  CHECK(jobs[2].deviceMemory() == job.deviceMemory());  // the same on every rank of a node
  core::ClusterSpec cluster = job.cluster(3);
  CHECK(cluster.devices == 3);
  CHECK(cluster.devicesPerNode == 3);
  CHECK(cluster.memoryPerDevice == job.deviceMemory());
  // A dry run for 8 ranks on this node: the node's memory over 8.
  CHECK(job.cluster(8, 8).memoryPerDevice == job.nodeMemory / 8);
  CHECK(job.toString().find("3 rank(s), 3 per node, cpu") == 0);

  config.set("mem_limit_gb", "1.5", "test");
  config.set("comm_bandwidth", "2e9", "test");
  staging::testing::rethrowFirst(
      comm::runThreadRanks(1, [&](comm::ThreadBackend& b) { jobs[0] = resolveJob(b, config); }));
  CHECK(jobs[0].ranksPerNode == 1);
  CHECK(jobs[0].deviceMemory() == int64_t{3} << 29);
  CHECK(jobs[0].cluster(8, 8).memoryPerDevice == int64_t{3} << 29);  // the limit, not a share
  CHECK(jobs[0].cluster(2).intraNodeBandwidth == 2e9);
  CHECK(jobs[0].toString().find("(mem_limit_gb)") != std::string::npos);
}

TEST_CASE("the plan cache key names the job's layout and memory", "[driver]") {
  core::globalConfig().set("plan_cache_dir", "/tmp/autostage-cache-key-test", "test");
  JobSpec job;
  job.worldSize = 4;
  job.ranksPerNode = 2;
  job.nodeMemory = int64_t{8} << 30;
  const std::string path = planCachePath("abc", job, 32, core::PlanUsage::TrainStep);
  CHECK(path.find("/tmp/autostage-cache-key-test/plan-abc-np4-b32-train_step-") == 0);
  CHECK(planCachePath("abc", job, 32, core::PlanUsage::TrainStep) == path);
  JobSpec other = job;
  other.ranksPerNode = 4;  // same world, another layout
  CHECK(planCachePath("abc", other, 32, core::PlanUsage::TrainStep) != path);
  other = job;
  other.memoryLimit = int64_t{1} << 30;  // the plan assumes other devices
  CHECK(planCachePath("abc", other, 32, core::PlanUsage::TrainStep) != path);
  core::globalConfig().set("plan_cache_dir", "", "test");
  CHECK(planCachePath("abc", job, 32, core::PlanUsage::TrainStep).empty());
}

TEST_CASE("one exchange agrees on a wrapper's problem, how ranks call and their inputs",
          "[driver]") {
  constexpr int kWorld = 2;
  std::vector<std::string> errors(kWorld), tensorsSeen(kWorld);
  auto run = [&](const std::function<void(comm::ThreadBackend&)>& call) {
    std::fill(errors.begin(), errors.end(), std::string());
    staging::testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
      errors[b.rank()] = staging::testing::errorOf([&] { call(b); });
    }));
  };
  at::Tensor x = torch::randn({4, 3});
  // All alike: the tensors come back.
  run([&](comm::ThreadBackend& b) {
    tensorsSeen[b.rank()] = std::to_string(agreeOnCall(b, {x}, "forward").size());
  });
  CHECK(errors == std::vector<std::string>(kWorld));
  CHECK(tensorsSeen == std::vector<std::string>(kWorld, "1"));
  // A problem a wrapper found on rank 1 only, named by the wrapper's step.
  run([&](comm::ThreadBackend& b) {
    comm::StepStatus problem;
    if (b.rank() == 1) problem = {"UnsupportedError", "input 1 is a str"};
    agreeOnCall(b, {x}, "forward", problem, "checking the call");
  });
  for (const std::string& e : errors)
    CHECK(e == "checking the call failed on rank 1: input 1 is a str");
  // Ranks calling differently, and inputs of other shapes, in the same exchange.
  run([&](comm::ThreadBackend& b) {
    agreeOnCall(b, {x}, b.rank() == 0 ? "forward, train mode" : "forward, eval mode");
  });
  for (const std::string& e : errors) {
    CHECK_THAT(e, Catch::Contains("ranks called the module differently") &&
                      Catch::Contains("rank 1: forward, eval mode"));
  }
  run([&](comm::ThreadBackend& b) {
    agreeOnCall(b, {b.rank() == 0 ? x : torch::randn({4, 5})}, "forward");
  });
  for (const std::string& e : errors) CHECK_THAT(e, Catch::Contains("Float[4, 5]"));
}

}  // namespace
}  // namespace autostage::driver
