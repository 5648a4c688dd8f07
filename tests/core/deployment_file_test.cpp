#include "core/proto/deployment_file.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/proto/file_format.h"
#include "tests/core/scratch_files.h"

using namespace autostage;
using namespace autostage::core;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return testing::scratchPath("deployment_file_test", name); }

std::string readBytes(const fs::path& path) { return testing::readFileBytes(path); }

StageDeployment stage(int id, std::vector<NodeId> nodes, std::vector<int> ranks) {
  StageDeployment s;
  s.id = id;
  s.name = "STAGE_" + std::to_string(nodes.front()) + "_" + std::to_string(nodes.back());
  s.nodes = std::move(nodes);
  s.ranks = std::move(ranks);
  s.recompute = id == 1;
  s.forwardSeconds = 0.01 * (id + 1);
  s.backwardSeconds = 0.02 * (id + 1);
  s.allreduceSeconds = 1e-3 / (id + 1);
  s.inputBytes = 1000 + id;
  s.outputBytes = 2000 + id;
  s.paramBytes = (int64_t{5} << 30) + id;
  s.activationBytes = 3000 + id;
  s.optimizerBytes = (int64_t{10} << 30) + id;
  s.commBufferBytes = 4000 + id;
  s.totalMemoryBytes = (int64_t{30} << 30) + id;
  s.sendForwardSeconds = 1e-4 * (id + 1);
  s.sendBackwardSeconds = 2e-4 * (id + 1);
  s.microBatchPerReplica = 4 + id;
  s.gradientBytes = (int64_t{5} << 30) + id;
  s.workingBytes = 5000 + id;
  s.zero = id == 0;
  return s;
}

Route route(ValueId value, int producer, std::vector<int> consumers, bool output, bool gradient) {
  Route r;
  r.value = value;
  r.producerStage = producer;
  r.consumerStages = std::move(consumers);
  r.graphOutput = output;
  r.carriesGradient = gradient;
  return r;
}

// 3 stages on 8 ranks: stage 0 replicated 4 times (ranks out of order), stage 1 twice, stage 2
// once, rank 7 idle. Routes: the feeder to stages 0 and 2, a skip connection 0 -> {1, 2}, a graph
// output from stage 1 also read by stage 2, the loss from stage 2 to the caller only.
Deployment sampleDeployment() {
  Deployment d;
  d.graphHash = "00ff00ff00ff00ff";
  d.worldSize = 8;
  d.devicesPerNode = 4;
  d.deviceMemory = int64_t{40} << 30;
  d.batchSize = 256;
  d.microBatchCount = 8;
  d.schedule = "1f1b";
  d.decomposer = "dp";
  d.stages = {stage(0, {0, 1, 2, 5}, {3, 0, 1, 2}), stage(1, {3, 4, 6}, {4, 5}),
              stage(2, {7, 8}, {6})};
  d.routes = {route(0, kFeederStage, {0, 2}, false, false), route(12, 0, {1, 2}, false, true),
              route(15, 1, {2}, true, true), route(20, 2, {}, true, true)};
  d.options = {{"max_blocks", "64"}, {"memory_margin", "0.1"}, {"schedule", "1f1b"}};
  d.predictedIterationSeconds = 0.123456789;
  return d;
}

std::string frame(const proto::Deployment& message) {
  return encodeFramed(kDeploymentFileKind, kDeploymentFormatVersion, message.SerializeAsString());
}

}  // namespace

TEST_CASE("deployment files round-trip stages, replicas, routes and options", "[core][proto]") {
  Deployment d = sampleDeployment();
  std::string path = scratch("plan.deployment").string();
  saveDeployment(d, path);
  Deployment back = loadDeployment(path);
  REQUIRE(back == d);
  // Spot checks independent of operator==.
  REQUIRE(back.stages.size() == 3);
  REQUIRE(back.stages[0].ranks == std::vector<int>{3, 0, 1, 2});
  REQUIRE(back.stages[0].replicaCount() == 4);
  REQUIRE(back.stages[1].recompute);
  REQUIRE(back.stages[0].zero);
  REQUIRE_FALSE(back.stages[1].zero);
  REQUIRE(back.stages[2].totalMemoryBytes == (int64_t{30} << 30) + 2);
  REQUIRE(back.routes[0].producerStage == kFeederStage);
  REQUIRE(back.routes[3].consumerStages.empty());
  REQUIRE(back.routes[2].graphOutput);
  REQUIRE(back.options.at("memory_margin") == "0.1");
  REQUIRE(back.predictedIterationSeconds == 0.123456789);
  REQUIRE(back.schedule == "1f1b");
  // Deterministic: the file is the encoding, and options inserted in another order encode alike.
  REQUIRE(readBytes(path) == encodeDeployment(d));
  Deployment reordered = d;
  reordered.options.clear();
  for (const char* key : {"schedule", "max_blocks", "memory_margin"})
    reordered.options[key] = d.options[key];
  REQUIRE(encodeDeployment(reordered) == encodeDeployment(d));
  REQUIRE(decodeDeployment(encodeDeployment(d)) == d);
}

TEST_CASE("an interleaved deployment round-trips: stage k on the ranks of stage k mod S",
          "[core][proto]") {
  Deployment d = sampleDeployment();
  d.worldSize = 4;
  d.virtualStages = 2;
  d.stages = {stage(0, {0, 1}, {0, 1}), stage(1, {2, 3}, {2, 3}), stage(2, {4, 5}, {0, 1}),
              stage(3, {6, 7}, {2, 3})};
  d.routes = {route(0, kFeederStage, {0, 2}, false, false), route(12, 0, {1, 2}, false, true),
              route(15, 2, {3}, false, true), route(20, 3, {}, true, true)};
  const Deployment back = decodeDeployment(encodeDeployment(d), "interleaved.bin");
  REQUIRE(back == d);
  REQUIRE(back.virtualStages == 2);
  REQUIRE(pipelinePositions(back) == 2);
  REQUIRE(back.stages[3].ranks == std::vector<int>{2, 3});
  Deployment other = d;
  other.virtualStages = 1;
  REQUIRE_FALSE(other == d);
}

TEST_CASE("a deployment that ran on several hosts round-trips each rank's hostname",
          "[core][proto]") {
  Deployment d = sampleDeployment();
  const std::string oneHost = encodeDeployment(d);
  d.rankHosts = {"b", "a", "a", "b", "c", "c", "c", "c"};  // Note [Hosts of a deployment]
  const std::string path = scratch("hosts.deployment").string();
  saveDeployment(d, path);
  const Deployment back = loadDeployment(path);
  REQUIRE(back == d);
  REQUIRE(back.rankHosts == d.rankHosts);
  REQUIRE(encodeDeployment(back) == encodeDeployment(d));
  // One host records none, and encodes to the bytes it had before the field existed.
  REQUIRE(toProto(sampleDeployment()).rank_hosts_size() == 0);
  REQUIRE(decodeDeployment(oneHost).rankHosts.empty());
  Deployment cleared = back;
  cleared.rankHosts.clear();
  REQUIRE(encodeDeployment(cleared) == oneHost);
}

TEST_CASE("a tensor-parallel deployment round-trips: replica i on ranks i t to (i + 1) t - 1",
          "[core][proto]") {
  Deployment d = sampleDeployment();
  d.stages[0].ranks = {0, 1, 2, 3};  // 2 replicas of 2 ranks on node 0
  d.stages[0].tensorParallel = 2;
  d.stages[1].ranks = {4, 5, 6, 7};  // 1 replica of 4 ranks on node 1
  d.stages[1].tensorParallel = 4;
  d.stages.pop_back();
  d.routes = {route(0, kFeederStage, {0}, false, false), route(12, 0, {1}, false, true),
              route(20, 1, {}, true, true)};
  const Deployment back = decodeDeployment(encodeDeployment(d), "tp.bin");
  REQUIRE(back == d);
  REQUIRE(back.stages[0].tensorParallel == 2);
  REQUIRE(back.stages[0].replicaCount() == 2);
  REQUIRE(back.stages[1].replicaCount() == 1);
  REQUIRE(toProto(back).stages(1).tensor_parallel() == 4);
  // Degree 1 is not written, so a deployment without tensor parallelism keeps its bytes.
  REQUIRE(toProto(sampleDeployment()).stages(0).tensor_parallel() == 0);
  // A group across nodes, and a degree not dividing the stage's ranks, are refused.
  Deployment across = d;
  across.stages[0].ranks = {0, 1, 3, 7};  // the second pair spans nodes 0 and 1
  across.stages[1].ranks = {2, 4, 5, 6};
  REQUIRE_THROWS_WITH(decodeDeployment(encodeDeployment(across), "tp.bin"),
                      Catch::Contains("tensor-parallel group of ranks 3..7 across nodes of 4"));
  Deployment uneven = d;
  uneven.stages[1].tensorParallel = 3;
  REQUIRE_THROWS_WITH(decodeDeployment(encodeDeployment(uneven), "tp.bin"),
                      Catch::Contains("tensor_parallel 3 for 4 ranks"));
}

TEST_CASE("deployment operator== sees stages, routes and options", "[core][proto]") {
  const Deployment d = sampleDeployment();
  auto differs = [&](auto&& change) {
    Deployment e = d;
    change(e);
    return !(e == d);
  };
  REQUIRE(differs([](Deployment& e) { e.stages[1].ranks = {5, 4}; }));
  REQUIRE(differs([](Deployment& e) { e.stages[2].commBufferBytes = 0; }));
  REQUIRE(differs([](Deployment& e) { e.stages[0].recompute = true; }));
  REQUIRE(differs([](Deployment& e) { e.stages[1].zero = true; }));
  REQUIRE(differs([](Deployment& e) { e.stages[1].tensorParallel = 2; }));
  REQUIRE(differs([](Deployment& e) { e.routes[1].carriesGradient = false; }));
  REQUIRE(differs([](Deployment& e) { e.routes[0].consumerStages = {0}; }));
  REQUIRE(differs([](Deployment& e) { e.options["max_blocks"] = "32"; }));
  REQUIRE(differs([](Deployment& e) { e.microBatchCount = 4; }));
  REQUIRE(differs([](Deployment& e) { e.decomposer = "gpipe"; }));
  REQUIRE(differs([](Deployment& e) { e.rankHosts.assign(8, "a"); }));
}

TEST_CASE("truncated, corrupted and foreign deployment bytes are FormatErrors", "[core][proto]") {
  std::string good = encodeDeployment(sampleDeployment());
  for (size_t cut = 0; cut < good.size(); ++cut)
    REQUIRE_THROWS_AS(decodeDeployment(good.substr(0, cut)), FormatError);
  std::string flipped = good;
  flipped[flipped.size() - 30] ^= 0x40;
  REQUIRE_THROWS_WITH(decodeDeployment(flipped, "from rank 0"),
                      Catch::StartsWith("from rank 0") && Catch::Contains("corrupted"));
  std::string payload = toProto(sampleDeployment()).SerializeAsString();
  REQUIRE_THROWS_WITH(decodeDeployment(encodeFramed("graph", 1, payload)),
                      Catch::Contains("is a graph file, expected a deployment file"));
  REQUIRE_THROWS_WITH(
      decodeDeployment(encodeFramed("deployment", 0, payload)),
      Catch::Contains("deployment format version 0") && Catch::Contains("reads version 1"));
}

TEST_CASE("inconsistent deployments are FormatErrors naming the stage, rank or route",
          "[core][proto]") {
  const proto::Deployment good = toProto(sampleDeployment());
  REQUIRE_NOTHROW(decodeDeployment(frame(good)));
  using P = proto::Deployment;
  auto requireRefused = [&](auto&& mutate, std::initializer_list<std::string> parts) {
    P bad = good;
    mutate(bad);
    std::string message = "no error";
    try {
      decodeDeployment(frame(bad), "plan.bin");
    } catch (const FormatError& e) {
      message = e.what();
    }
    REQUIRE_THAT(message, Catch::StartsWith("plan.bin: ") && Catch::Contains("re-plan"));
    for (const std::string& part : parts) REQUIRE_THAT(message, Catch::Contains(part));
  };
  requireRefused([](P& m) { m.mutable_stages(1)->set_id(2); },
                 {"stage entry 1 ('STAGE_3_6') has id 2, expected 1"});
  requireRefused([](P& m) { m.mutable_stages()->SwapElements(0, 1); },
                 {"stage entry 0 ('STAGE_3_6') has id 1, expected 0"});
  requireRefused([](P& m) { m.mutable_stages(2)->clear_ranks(); },
                 {"stage 2 ('STAGE_7_8') has no rank"});
  requireRefused([](P& m) { m.mutable_stages(2)->set_ranks(0, 4); },
                 {"rank 4 holds a replica of stage 1 and of stage 2", "one pipeline position"});
  // Interleaved: 3 stages cannot be 2 per position; a virtual stage off its position's ranks.
  requireRefused([](P& m) { m.set_virtual_stages(2); },
                 {"virtual_stages is 2 for 3 stages", "divisor"});
  requireRefused([](P& m) { m.set_virtual_stages(3); },
                 {"stage 1 ('STAGE_3_6') is virtual stage 1 of pipeline position 0",
                  "virtual_stages=3"});
  requireRefused([](P& m) { m.mutable_stages(0)->set_ranks(3, 0); },
                 {"stage 0 ('STAGE_0_5') lists rank 0 twice"});
  requireRefused([](P& m) { m.mutable_stages(2)->set_ranks(0, 8); },
                 {"stage 2 ('STAGE_7_8') runs on rank 8", "0..7 (world_size=8)"});
  requireRefused([](P& m) { m.mutable_stages(2)->set_ranks(0, -1); }, {"runs on rank -1"});
  requireRefused([](P& m) { m.mutable_routes(1)->set_producer_stage(3); },
                 {"route 1 (value 12) comes from stage 3", "a stage in 0..2"});
  requireRefused([](P& m) { m.mutable_routes(0)->set_producer_stage(-2); },
                 {"route 0 (value 0) comes from stage -2"});
  requireRefused([](P& m) { m.mutable_routes(2)->add_consumer_stages(5); },
                 {"route 2 (value 15) goes to stage 5"});
  requireRefused([](P& m) { m.set_world_size(0); }, {"world_size is 0, expected at least 1"});
  requireRefused([](P& m) { m.set_micro_batch_count(0); }, {"micro_batch_count is 0"});
  requireRefused([](P& m) { m.add_rank_hosts("a"); },
                 {"rank_hosts names 1 hosts for world_size 8", "none or one per rank"});
  requireRefused([](P& m) { *m.add_options() = m.options(0); },
                 {"option 'max_blocks' appears twice"});
}

TEST_CASE("describeMismatch names every field a saved deployment was planned for",
          "[core][proto]") {
  const Deployment d = sampleDeployment();
  DeploymentKey key{d.graphHash, d.worldSize, d.deviceMemory, d.batchSize};
  REQUIRE(describeMismatch(d, key) == "");

  DeploymentKey fewer = key;
  fewer.worldSize = 4;
  REQUIRE(describeMismatch(d, fewer) == "deployment was planned for world_size=8, this job has 4");

  DeploymentKey all{"1111222233334444", 16, int64_t{80} << 30, 512};
  std::string message = describeMismatch(d, all);
  REQUIRE_THAT(message,
               Catch::StartsWith("deployment was planned for ") &&
                   Catch::Contains("graph_hash=00ff00ff00ff00ff, this job has 1111222233334444") &&
                   Catch::Contains("world_size=8, this job has 16") &&
                   Catch::Contains("device_memory=42949672960 (40.00 GiB), this job has "
                                   "85899345920 (80.00 GiB)") &&
                   Catch::Contains("batch_size=256, this job has 512"));
  DeploymentKey memoryOnly = key;
  memoryOnly.deviceMemory = 1;
  REQUIRE_THAT(describeMismatch(d, memoryOnly),
               Catch::Contains("device_memory=") && !Catch::Contains("world_size") &&
                   !Catch::Contains("batch_size") && !Catch::Contains("graph_hash"));
}

TEST_CASE("deployment fields added later are 0 when an older file lacks them", "[core]") {
  Deployment d = sampleDeployment();
  proto::Deployment message = toProto(d);
  message.clear_devices_per_node();
  message.clear_virtual_stages();
  message.clear_rank_hosts();
  for (auto& stage : *message.mutable_stages()) {
    stage.clear_send_forward_seconds();
    stage.clear_send_backward_seconds();
    stage.clear_micro_batch_per_replica();
    stage.clear_gradient_bytes();
    stage.clear_working_bytes();
    stage.clear_zero();
  }
  Deployment old = fromProto(message, "old file");
  REQUIRE(old.devicesPerNode == 0);
  REQUIRE(old.virtualStages == 1);  // files from before interleaving: one stage per position
  REQUIRE(old.rankHosts.empty());    // files from before hosts were recorded: one host or unknown
  REQUIRE(old.stages[0].sendForwardSeconds == 0);
  REQUIRE(old.stages[1].gradientBytes == 0);
  REQUIRE_FALSE(old.stages[0].zero);  // files from before ZeRO-1 load as zero=0
  REQUIRE(old.stages[0].totalMemoryBytes == d.stages[0].totalMemoryBytes);
  // Everything else is as saved.
  for (auto& s : d.stages) s.sendForwardSeconds = s.sendBackwardSeconds = 0, s.microBatchPerReplica = 0,
                           s.gradientBytes = s.workingBytes = 0, s.zero = false;
  d.devicesPerNode = 0;
  REQUIRE(old == d);
}
