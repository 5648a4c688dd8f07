#include "profiler/device_model.h"

#include "catch_torch.h"

#include "core/error.h"

using namespace autostage;
using namespace autostage::profiler;

TEST_CASE("rescaling by FLOP ratio scales times, keeps memory, labels as estimated",
          "[profiler]") {
  core::GraphProfile measured;
  measured.deviceKind = "cpu";
  measured.nodes.resize(2);
  core::NodeProfile& node = measured.nodes[1];
  node.node = 1;
  node.forwardSeconds = {2e-3, 1e-4};
  node.backwardSeconds = {4e-3, 2e-4};
  node.activationBytes = {0, 128};
  node.paramBytes = 4096;
  core::ClusterSpec target = core::ClusterSpec::fromToml(R"(
device_kind = "a100"
devices = 8
devices_per_node = 4
memory_per_device = "40GiB"
intra_node_bandwidth = 300e9
inter_node_bandwidth = 25e9
latency = 5e-6
peak_flops = 312e12
)", "test");
  core::GraphProfile estimated = rescaleProfile(measured, 1e12, target);
  double factor = 1e12 / 312e12;
  CHECK(estimated.estimated);
  CHECK(estimated.deviceKind == "estimated:a100");
  CHECK(estimated.nodes[1].forwardSeconds.fixed == Approx(2e-3 * factor));
  CHECK(estimated.nodes[1].backwardSeconds.perSample == Approx(2e-4 * factor));
  CHECK(estimated.nodes[1].activationBytes == measured.nodes[1].activationBytes);
  CHECK(estimated.nodes[1].paramBytes == 4096);
  CHECK(estimated.comm.p2pInterNode.bytesPerSecond == 25e9);
  CHECK(estimated.comm.p2pIntraNode.bytesPerSecond == 300e9);
  CHECK(estimated.comm.p2pIntraNode.latencySeconds == 5e-6);
  CHECK_FALSE(estimated.comm.measured);
  CHECK_THROWS_AS(rescaleProfile(measured, 0, target), ConfigError);
}
