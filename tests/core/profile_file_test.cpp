#include "core/proto/profile_file.h"

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

fs::path scratch(const std::string& name) { return testing::scratchPath("profile_file_test", name); }

std::string readBytes(const fs::path& path) { return testing::readFileBytes(path); }

// Four node entries with distinct values in every field (so a swapped field would show), one
// failed node, one unfilled entry (node == kNoNode), a measured comm profile.
GraphProfile sampleProfile() {
  GraphProfile p;
  p.graphHash = "0123456789abcdef";
  p.deviceKind = "cuda:NVIDIA A100-SXM4-40GB";
  p.dtype = "Half";
  p.estimated = true;
  p.calibration = 1.0 / 3.0;
  p.calibrationError = 0.0625;
  p.batchSizes = {1, 8, 64};
  for (int i = 0; i < 4; ++i) {
    NodeProfile n;
    n.node = i;
    double k = i + 1;
    n.forwardSeconds = {1e-5 * k, 2e-7 * k};
    n.backwardSeconds = {3e-5 * k, 4e-7 * k};
    n.outputBytes = {0, 4096 * k};
    n.activationBytes = {128 * k, 8192 * k};
    n.workingBytes = {-1.5 * k, 7 * k};
    n.paramBytes = int64_t{1} << (30 + i);
    n.maxBatch = i == 2 ? 32 : -1;
    n.failure = i == 2 ? "CUDA out of memory at batch 64" : "";
    if (i == 1)  // measured on tensor-parallel members (Note [Tensor-parallel profile])
      n.split = {{2, {6e-6, 1.1e-7}, {1.6e-5, 2.1e-7}}, {4, {4e-6, 6e-8}, {9e-6, 1.2e-7}}};
    p.nodes.push_back(n);
  }
  p.nodes.push_back(NodeProfile{});  // an entry nobody filled
  p.comm.p2pIntraNode = {5e-6, 3e11};
  p.comm.p2pInterNode = {2e-5, 2.5e10};
  p.comm.allreduceIntraNode = {7e-6, 2.4e11};
  p.comm.allreduceInterNode = {3e-5, 2e10};
  p.comm.allreduceGroups = {{2, {4e-6, 2.6e11}}, {4, {6e-6, 2.5e11}}};
  p.comm.measured = true;
  return p;
}

}  // namespace

TEST_CASE("profile files round-trip every field", "[core][proto]") {
  GraphProfile p = sampleProfile();
  std::string path = scratch("p.profile").string();
  saveProfile(p, path);
  GraphProfile back = loadProfile(path);
  REQUIRE(back == p);
  // Spot checks independent of operator==.
  REQUIRE(back.calibration == 1.0 / 3.0);
  REQUIRE(back.nodes.size() == 5);
  REQUIRE(back.nodes[3].paramBytes == int64_t{1} << 33);
  REQUIRE(back.nodes[2].failure == "CUDA out of memory at batch 64");
  REQUIRE(back.nodes[2].maxBatch == 32);
  REQUIRE(back.nodes[1].workingBytes.fixed == -3.0);
  REQUIRE(back.nodes[4].node == kNoNode);
  REQUIRE(back.comm.allreduceInterNode.bytesPerSecond == 2e10);
  REQUIRE(back.comm.allreduceGroups.size() == 2);
  REQUIRE(back.comm.allreduceGroups.at(4).latencySeconds == 6e-6);
  REQUIRE(back.batchSizes == std::vector<int64_t>{1, 8, 64});
  REQUIRE(back.nodes[1].split.size() == 2);
  REQUIRE(back.nodes[1].splitAt(4)->backwardSeconds.perSample == 1.2e-7);
  REQUIRE(back.nodes[1].splitAt(8) == nullptr);
  REQUIRE(back.nodes[2].split.empty());
  REQUIRE(readBytes(path) == encodeProfile(p));
  REQUIRE(encodeProfile(p) == encodeProfile(back));
  REQUIRE(decodeProfile(encodeProfile(GraphProfile{})) == GraphProfile{});
}

TEST_CASE("profile operator== sees every field", "[core][proto]") {
  const GraphProfile p = sampleProfile();
  auto differs = [&](auto&& change) {
    GraphProfile q = p;
    change(q);
    return !(q == p);
  };
  REQUIRE(differs([](GraphProfile& q) { q.graphHash = "x"; }));
  REQUIRE(differs([](GraphProfile& q) { q.estimated = false; }));
  REQUIRE(differs([](GraphProfile& q) { q.calibrationError = 0; }));
  REQUIRE(differs([](GraphProfile& q) { q.batchSizes.pop_back(); }));
  REQUIRE(differs([](GraphProfile& q) { q.nodes[1].backwardSeconds.perSample = 0; }));
  REQUIRE(differs([](GraphProfile& q) { q.nodes[1].activationBytes.fixed = 0; }));
  REQUIRE(differs([](GraphProfile& q) { q.nodes[2].maxBatch = 64; }));
  REQUIRE(differs([](GraphProfile& q) { q.nodes[2].failure.clear(); }));
  REQUIRE(differs([](GraphProfile& q) { q.nodes[1].split[1].forwardSeconds.fixed = 0; }));
  REQUIRE(differs([](GraphProfile& q) { q.nodes[1].split[0].degree = 8; }));
  REQUIRE(differs([](GraphProfile& q) { q.nodes[1].split.pop_back(); }));
  REQUIRE(differs([](GraphProfile& q) { q.comm.measured = false; }));
  REQUIRE(differs([](GraphProfile& q) { q.comm.p2pInterNode.latencySeconds = 0; }));
  REQUIRE(differs([](GraphProfile& q) { q.comm.allreduceGroups.at(2).bytesPerSecond = 1; }));
  REQUIRE(differs([](GraphProfile& q) { q.comm.allreduceGroups.erase(4); }));
}

TEST_CASE("every truncation, a flipped byte and a foreign kind of profile file are refused",
          "[core][proto]") {
  std::string good = encodeProfile(sampleProfile());
  for (size_t cut = 0; cut < good.size(); ++cut)
    REQUIRE_THROWS_AS(decodeProfile(good.substr(0, cut)), FormatError);
  std::string flipped = good;
  flipped[flipped.size() - 20] ^= 0x10;
  REQUIRE_THROWS_WITH(decodeProfile(flipped), Catch::Contains("corrupted"));
  std::string payload = toProto(sampleProfile()).SerializeAsString();
  REQUIRE_THROWS_WITH(decodeProfile(encodeFramed("graph", 1, payload)),
                      Catch::Contains("is a graph file, expected a profile file"));
  REQUIRE_THROWS_WITH(
      decodeProfile(encodeFramed("profile", 7, payload)),
      Catch::Contains("profile format version 7") && Catch::Contains("reads version 1"));
}

TEST_CASE("profile entries must be indexed by node id", "[core][proto]") {
  proto::GraphProfile message = toProto(sampleProfile());
  message.mutable_nodes(2)->set_node(3);
  std::string bytes =
      encodeFramed(kProfileFileKind, kProfileFormatVersion, message.SerializeAsString());
  REQUIRE_THROWS_WITH(decodeProfile(bytes, "cache.profile"),
                      Catch::StartsWith("cache.profile: profile entry 2 is for node 3") &&
                          Catch::Contains("re-profile"));
}

TEST_CASE("a cached profile of another graph, device or dtype is refused naming the field",
          "[core][proto]") {
  GraphProfile p = sampleProfile();
  std::string path = scratch("cache.profile").string();
  saveProfile(p, path);
  REQUIRE(loadProfileFor(path, p.graphHash, p.deviceKind, p.dtype) == p);

  REQUIRE_THROWS_WITH(
      loadProfileFor(path, "fedcba9876543210", p.deviceKind, p.dtype),
      Catch::Contains("graph_hash is '0123456789abcdef', expected 'fedcba9876543210'") &&
          Catch::Contains("delete the cache file or re-profile") &&
          !Catch::Contains("device_kind") && !Catch::Contains("dtype is"));
  REQUIRE_THROWS_WITH(
      loadProfileFor(path, p.graphHash, "cpu", p.dtype),
      Catch::Contains("device_kind is 'cuda:NVIDIA A100-SXM4-40GB', expected 'cpu'") &&
          !Catch::Contains("graph_hash"));
  REQUIRE_THROWS_WITH(
      loadProfileFor(path, p.graphHash, p.deviceKind, "Float"),
      Catch::Contains("dtype is 'Half', expected 'Float'") && !Catch::Contains("graph_hash"));
  REQUIRE_THROWS_WITH(loadProfileFor(path, "h", "cpu", "Float"),
                      Catch::Contains("graph_hash is") && Catch::Contains("device_kind is") &&
                          Catch::Contains("dtype is") && Catch::Contains(path));
  REQUIRE_THROWS_AS(loadProfileFor(path, "h", "cpu", "Float"), FormatError);
}
