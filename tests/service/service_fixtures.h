#pragma once
// What the service's tests plan: a small synthetic model on a small cluster, a scratch
// directory for a store and a socket, and a stored answer damaged on disk.

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/cluster_spec.h"
#include "core/ir/graph.h"
#include "core/profile.h"
#include "decomposer/plan.h"
#include "decomposer/synthetic.h"
#include "scratch_files.h"
#include "service/plan_call.h"

namespace autostage::service::fixtures {

struct Model {
  core::Graph graph;
  core::GraphProfile profile;
};

inline Model syntheticModel(const std::string& spec = "mlp:layers=12") {
  decomposer::SyntheticModel m = decomposer::syntheticFromSpec(spec, decomposer::DeviceModel());
  return {std::move(m.graph), std::move(m.profile)};
}

inline core::ClusterSpec cluster(int devices, double gib = 16) {
  core::ClusterSpec c;
  c.devices = devices;
  c.devicesPerNode = devices;
  c.memoryPerDevice = static_cast<int64_t>(gib * (1 << 30));
  return c;
}

inline decomposer::PlanOptions options() {
  decomposer::PlanOptions o;
  o.partitionNum = 2;
  return o;
}

// The call for `m` at global batch `batch`, files sent, on 4 devices.
inline proto::PlanCall planCall(const Model& m, int64_t batch) {
  return makePlanCall(m.graph, m.profile, cluster(4), batch, options());
}

// A fresh scratch directory and a socket path inside it.
struct Place {
  std::string dir, listen;
  explicit Place(const std::string& name) {
    std::filesystem::path d = autostage::testing::scratchPath("service_tests", name);
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    dir = d.string();
    listen = "unix:" + dir + "/planner.sock";
  }
};

// Flips a byte near the end of the stored answer of `planKey`: its hash no longer matches.
inline void damageStoredAnswer(const std::string& storeDirectory, const std::string& planKey) {
  const std::string path = storeDirectory + "/plans/" + planKey + ".answer";
  std::string bytes = autostage::testing::readFileBytes(path);
  REQUIRE(bytes.size() > 40);
  bytes[bytes.size() - 5] ^= 0x5a;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace autostage::service::fixtures
