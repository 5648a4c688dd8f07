// Note [Resolving the job], the plan call built from it (Note [One planner]), and Note [One agreement per call].
#include "driver/job.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "catch_torch.h"  // last: glog's CHECK must not replace Catch2's (NOTES-libtorch.md)

#include "comm/comm_options.h"
#include "comm/thread_backend.h"
#include "comm/thread_world.h"
#include "core/config.h"
#include "core/error.h"
#include "driver/module.h"
#include "driver/placement.h"
#include "driver/auto_planner.h"
#include "service/plan_call.h"
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
  CHECK(job.device().kindText() == "cpu");
  REQUIRE(job.device().memoryBytes > 0);
  CHECK(job.memoryLimit == 0);
  CHECK(job.deviceMemory() == job.device().memoryBytes / 3);
  CHECK(jobs[2].deviceMemory() == job.deviceMemory());  // the same on every rank of a node
  core::ClusterSpec cluster = job.cluster(3);
  CHECK(cluster.devices == 3);
  CHECK(cluster.devicesPerNode == 3);
  CHECK(cluster.memoryPerDevice == job.deviceMemory());
  // A dry run for 8 ranks on this node: the node's memory over 8.
  CHECK(job.cluster(8, 8).memoryPerDevice == job.device().memoryBytes / 8);
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

// Note [Device and transport], over the facts of a CPU build, a GPU node and a shared GPU.
TEST_CASE("device and transport: auto, explicit choices, and each refusal", "[driver]") {
  const DeviceFacts cpuBuild{false, 0, {}}, noGpu{true, 0, {}}, fourGpus{true, 4, {}},
      oneGpu{true, 1, {}};
  auto text = [](const Placement& p) { return p.toString() + " / " + p.why; };
  CHECK(text(choosePlacement("auto", "auto", cpuBuild, 0, 2)) ==
        "cpu over mpi / device=auto: this build has no CUDA");
  CHECK(text(choosePlacement("auto", "auto", noGpu, 0, 2)) ==
        "cpu over mpi / device=auto: no GPU visible");
  CHECK(text(choosePlacement("cpu", "mpi", fourGpus, 0, 2)) == "cpu over mpi / device=cpu");
  // One GPU per rank: NCCL; rank r takes cuda:(local rank mod GPUs).
  CHECK(choosePlacement("auto", "auto", fourGpus, 3, 4).toString() == "cuda:3 over nccl");
  CHECK(choosePlacement("cuda", "nccl", fourGpus, 1, 2).toString() == "cuda:1 over nccl");
  CHECK(choosePlacement("auto", "auto", fourGpus, 0, 4).why ==
        "comm_backend=auto: one GPU per rank (4 ranks on this node, 4 GPU(s))");

  using Catch::Contains;
  CHECK_THROWS_AS(choosePlacement("gpu", "auto", fourGpus, 0, 1), ConfigError);
  CHECK_THROWS_WITH(choosePlacement("auto", "gloo", fourGpus, 0, 1),
                    Contains("comm_backend=gloo is not a transport: use auto, mpi or nccl"));
  CHECK_THROWS_WITH(choosePlacement("cuda", "auto", cpuBuild, 0, 1),
                    Contains("device=cuda, but this build of autostage has no CUDA") &&
                        Contains("-DAUTOSTAGE_WITH_CUDA=ON"));
  CHECK_THROWS_WITH(choosePlacement("cuda", "auto", noGpu, 0, 1),
                    Contains("torch sees no GPU") && Contains("CUDA_VISIBLE_DEVICES"));
  CHECK_THROWS_WITH(choosePlacement("cpu", "nccl", fourGpus, 0, 1),
                    Contains("comm_backend=nccl carries CUDA tensors, but this job runs on the "
                             "cpu"));
  // More ranks than GPUs on a node: NCCL refuses two ranks on one GPU.
  CHECK_THROWS_AS(choosePlacement("cuda", "nccl", oneGpu, 0, 2), ConfigError);
  CHECK_THROWS_WITH(choosePlacement("cuda", "nccl", oneGpu, 0, 2),
                    Contains("comm_backend=nccl with 2 ranks on this node, 1 GPU(s)") &&
                        Contains("start at most 1 rank(s) per node"));
  // auto picks MPI there and says why: the ranks share the GPU, CUDA tensors go through host
  // memory (Note [CUDA tensors over MPI]).
  const Placement shared = choosePlacement("auto", "auto", oneGpu, 1, 2);
  CHECK(shared.toString() == "cuda:0 over mpi");
  CHECK(shared.why == "comm_backend=auto: 2 ranks on this node, 1 GPU(s), and NCCL refuses two "
                      "ranks on one GPU, so CUDA tensors go over MPI");
  CHECK(choosePlacement("cuda", "mpi", fourGpus, 2, 4).toString() == "cuda:2 over mpi");
  CHECK(choosePlacement("cuda", "auto", oneGpu, 0, 1).toString() == "cuda:0 over nccl");
}

TEST_CASE("a transport given by the caller decides the device - device= must agree", "[driver]") {
  core::Config config;
  std::vector<std::string> errors(2);
  staging::testing::rethrowFirst(comm::runThreadRanks(2, [&](comm::ThreadBackend& b) {
    JobSpec job = resolveJob(b, config, DeviceFacts{true, 2, {}});
    if (job.placement.toString() != "cpu over thread") errors[b.rank()] = job.placement.toString();
    core::Config cuda;
    cuda.set("device", "cuda", "test");
    errors[b.rank()] += staging::testing::errorOf([&] {
      resolveJob(b, cuda, DeviceFacts{true, 2, {}});
    });
  }));
  for (const std::string& e : errors)
    CHECK(e ==
          "device=cuda, but the transport given (thread) carries CPU tensors: use device=auto");
}

// The rank's view of an MPI job, without MPI: resolveJob reads only the name and the layout.
class MpiLayout final : public comm::ThreadBackend {
 public:
  MpiLayout(int worldSize, int rank)
      : comm::ThreadBackend(std::make_shared<comm::ThreadWorld>(worldSize, comm::CommOptions{}),
                            rank) {}
  std::string name() const override { return "mpi"; }
};

TEST_CASE("a CUDA job: the GPU's model names the device, its memory (shared by the ranks on "
          "it) is the device memory, never host RAM", "[driver]") {
  DeviceFacts twoGpus{true, 2, {{"NVIDIA H100 80GB HBM3", int64_t{80} << 30},
                                {"NVIDIA H100 80GB HBM3", int64_t{80} << 30}}};
  core::Config config;
  config.set("device", "cuda", "test");
  // Two ranks, one GPU each: NCCL, the whole GPU per rank.
  JobSpec job = resolveJob(MpiLayout(2, 1), config, twoGpus);
  CHECK(job.placement.toString() == "cuda:1 over nccl");
  CHECK(job.device().kindText() == "cuda:NVIDIA H100 80GB HBM3");
  CHECK(job.deviceMemory() == int64_t{80} << 30);
  CHECK(job.cluster(2).deviceKind == "cuda:NVIDIA H100 80GB HBM3");
  CHECK(job.cluster(2).memoryPerDevice == int64_t{80} << 30);
  CHECK(job.toString().find("80.00 GiB per device (the GPU's 80.00 GiB over 1 rank(s))") !=
        std::string::npos);
  // Four ranks on two GPUs share them over MPI: half a GPU each; a dry run for 8 ranks on this
  // node plans for a quarter.
  job = resolveJob(MpiLayout(4, 2), config, twoGpus);
  CHECK(job.placement.toString() == "cuda:0 over mpi");
  CHECK(job.deviceMemory() == int64_t{40} << 30);
  CHECK(job.cluster(8, 8).memoryPerDevice == int64_t{20} << 30);
  // Three ranks on two GPUs: the busier GPU has two of them.
  CHECK(resolveJob(MpiLayout(3, 0), config, twoGpus).deviceMemory() == int64_t{40} << 30);
  // mem_limit_gb is still the limit per device.
  config.set("mem_limit_gb", "16", "test");
  CHECK(resolveJob(MpiLayout(4, 0), config, twoGpus).deviceMemory() == int64_t{16} << 30);
  // GPUs the runtime did not describe: a limit is needed, and the error says so.
  config.set("mem_limit_gb", "0", "test");
  CHECK_THROWS_WITH(resolveJob(MpiLayout(2, 0), config, DeviceFacts{true, 2, {}}),
                    Catch::Contains("the memory of cuda:0 is not known") &&
                        Catch::Contains("set mem_limit_gb"));
  config.set("mem_limit_gb", "2", "test");
  job = resolveJob(MpiLayout(2, 0), config, DeviceFacts{true, 2, {}});
  CHECK(job.device().kindText() == "cuda");
  CHECK(job.deviceMemory() == int64_t{2} << 30);
  // A CPU job on the same node keeps host memory.
  config.set("device", "cpu", "test");
  config.set("mem_limit_gb", "0", "test");
  job = resolveJob(MpiLayout(2, 0), config, twoGpus);
  CHECK(job.device().kindText() == "cpu");
  CHECK(job.deviceMemory() == job.device().memoryBytes / 2);
}

// What a job's plan call carries of the job and its options (Note [One planner]: the planning
// core's plan key is computed from the call's content, so a difference here is another key).
std::string planCallText(const JobSpec& job, const core::Config& config) {
  const profiler::ProfileKey key{"abc", job.device().kindText(), "Float", "abc\nprofiler's key"};
  proto::PlanCall call = service::makePlanCall(
      core::Graph(), nullptr, job.cluster(job.worldSize), 32,
      decomposer::PlanOptions::fromConfig(config));
  call.set_profile_key(planProfileKey(key, config, job.cluster(job.worldSize)));
  std::vector<std::string> options;
  for (const auto& [name, value] : call.options()) options.push_back(name + "=" + value);
  std::sort(options.begin(), options.end());  // a protobuf map's order is not its content
  std::string text = call.cluster() + '\n' + call.usage() + '\n' + call.profile_key();
  for (const std::string& option : options) text += '\n' + option;
  return text;
}

TEST_CASE("a job's plan call names the job's layout and memory", "[driver]") {
  JobSpec job;
  job.worldSize = 4;
  job.ranksPerNode = 2;
  job.placement.device.memoryBytes = int64_t{8} << 30;
  const std::string text = planCallText(job, core::globalConfig());
  CHECK(planCallText(job, core::globalConfig()) == text);
  JobSpec other = job;
  other.ranksPerNode = 4;  // same world, another layout
  CHECK(planCallText(other, core::globalConfig()) != text);
  other = job;
  other.memoryLimit = int64_t{1} << 30;  // the plan assumes other devices
  CHECK(planCallText(other, core::globalConfig()) != text);
  other = job;
  other.placement.device.kind = DeviceKind::Cuda;  // another device model
  other.placement.device.model = "NVIDIA A100-SXM4-40GB";
  other.gpusPerNode = 4;
  CHECK(planCallText(other, core::globalConfig()) != text);
}

TEST_CASE("every plan input of the option table is in a job's plan call, nothing else",
          "[driver]") {
  core::Config& config = core::globalConfig();
  JobSpec job;
  job.worldSize = 2;
  job.ranksPerNode = 2;
  job.placement.device.memoryBytes = int64_t{8} << 30;
  const std::string text = planCallText(job, config);
  const std::vector<std::string> inputs = core::planInputOptions();
  // Issue 28: the hand-kept list of the old plan cache's key lacked these although plans depend
  // on them.
  for (const char* key : {"measure_comm", "profile_passes", "profile_repeats", "comm_backend"})
    CHECK(std::find(inputs.begin(), inputs.end(), key) != inputs.end());
  // Planner options are read into PlanOptions, which checks them: another valid value each.
  const std::map<std::string, std::string> valid = {
      {"decomposer", "uniform"}, {"schedule", "gpipe"}, {"recompute", "always"}, {"zero", "1"},
      {"virtual_stages", "2"},   {"precision", "bf16"}, {"mem_margin", "0.2"},
      {"tensor_parallel", "auto"}};
  for (const core::OptionSpec& option : core::optionTable()) {
    const std::string before = config.text(option.key);
    // Another valid value of the option's type.
    std::string other;
    switch (option.type) {
      case core::OptionType::Bool: other = before == "true" ? "false" : "true"; break;
      case core::OptionType::Int: other = std::to_string(std::stoll(before) + 1); break;
      case core::OptionType::Float: other = std::to_string(std::stod(before) * 2 + 1); break;
      case core::OptionType::String: other = before + "x"; break;
    }
    if (valid.count(option.key)) other = valid.at(option.key);
    config.set(option.key, other, "test");
    INFO(option.key << ": " << before << " -> " << other);
    CHECK((planCallText(job, config) != text) == option.planInput);
    config.set(option.key, before, "test");
  }
  CHECK(planCallText(job, config) == text);
  // Note [Per-module plan options]: the call carries the options the plan reads, a module's own.
  core::Config own = config;
  own.set("zero", config.getString("zero") == "0" ? "1" : "0", "a module's own plan option");
  CHECK(planCallText(job, own) != text);
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
