// Device presets (Note [Device presets]): data-sheet figures, and what they change in a synthetic
// model's costs and plans.
#include "decomposer/device_presets.h"

#include <catch2/catch.hpp>

#include "core/error.h"
#include "decomposer/planner.h"
#include "decomposer/synthetic.h"

using namespace autostage;
using namespace autostage::decomposer;

namespace {

// Sums over a synthetic model's nodes and parameters.
struct Totals {
  double forwardSeconds = 0, activationBytes = 0, paramBytes = 0;
};

Totals totals(const SyntheticModel& m) {
  Totals t;
  for (const core::NodeProfile& p : m.profile.nodes) {
    t.forwardSeconds += p.forwardSeconds.at(1);
    t.activationBytes += p.activationBytes.at(1);
  }
  for (core::ValueId v : m.graph.inputs())
    if (m.graph.value(v).cls == core::ValueClass::Param)
      t.paramBytes += static_cast<double>(m.graph.value(v).type.bytes());
  return t;
}

TransformerShape gpt() {
  TransformerShape s;
  s.layers = 4;
  s.hidden = 1024;
  s.heads = 16;
  s.sequence = 1024;
  s.vocabulary = 32000;
  s.causal = true;
  return s;
}

}  // namespace

TEST_CASE("device presets hold the data sheets' figures and refuse unknown names", "[decomposer]") {
  REQUIRE(devicePresetNames() == std::vector<std::string>{"a100-40gb", "a100-80gb", "h100-80gb", "h200"});
  const DevicePreset& h200 = devicePreset("h200");
  CHECK(h200.memoryBytes == 143771.0 * 1048576);  // what nvidia-smi reported on the lent H200
  CHECK(h200.peakFlops("bf16") == Approx(989.4e12));
  CHECK(h200.peakFlops("fp32") == Approx(67e12));
  CHECK(devicePreset("a100-40gb").peakFlops("fp16") == Approx(312e12));
  CHECK(devicePreset("a100-80gb").hbmBytesPerSecond > devicePreset("a100-40gb").hbmBytesPerSecond);
  CHECK_THROWS_WITH(devicePreset("v100"), Catch::Contains("device preset 'v100' is unknown") &&
                                              Catch::Contains("h100-80gb"));
  CHECK_THROWS_WITH(h200.peakFlops("int8"), Catch::Contains("use fp32, bf16 or fp16"));
  const core::CommProfile comm = h200.comm();
  CHECK(comm.p2pIntraNode.bytesPerSecond == Approx(450e9 * kLinkEfficiency));
  CHECK(comm.allreduceInterNode.bytesPerSecond == Approx(50e9 * kLinkEfficiency));
}

TEST_CASE("a preset's precision sets the synthetic model's types and speed", "[decomposer]") {
  const DevicePreset& a100 = devicePreset("a100-80gb");
  const DeviceModel bf16 = a100.deviceModel("bf16"), fp32 = a100.deviceModel("fp32");
  CHECK(bf16.parameterType == core::DType::Float32);  // mixed precision keeps fp32 parameters
  CHECK(bf16.activationType == core::DType::BFloat16);
  CHECK(fp32.activationType == core::DType::Float32);
  CHECK(bf16.kind == "synthetic:NVIDIA A100-SXM4-80GB");
  const Totals low = totals(syntheticTransformer(gpt(), bf16));
  const Totals full = totals(syntheticTransformer(gpt(), fp32));
  CHECK(low.paramBytes == full.paramBytes);
  CHECK(low.activationBytes == Approx(full.activationBytes / 2));
  // 16x the peak FLOP/s and half the bytes: well over 4x faster, not more than 16x.
  CHECK(full.forwardSeconds > 4 * low.forwardSeconds);
  CHECK(full.forwardSeconds < 16 * low.forwardSeconds);
}

TEST_CASE("the same job plans faster on a faster preset", "[decomposer]") {
  auto iteration = [](const std::string& name) {
    const DevicePreset& preset = devicePreset(name);
    SyntheticModel m = syntheticTransformer(gpt(), preset.deviceModel("bf16"));
    m.profile.comm = preset.comm();
    core::ClusterSpec cluster;
    cluster.devices = 16;
    cluster.devicesPerNode = preset.devicesPerServer;
    cluster.memoryPerDevice = static_cast<int64_t>(preset.memoryBytes);
    PlanOptions options;
    options.precision = "bf16";
    return planGraph(m.graph, m.profile, cluster, 64, options).simulation.iterationSeconds;
  };
  const double a100 = iteration("a100-40gb"), h100 = iteration("h100-80gb");
  CHECK(h100 < a100 / 1.5);
}
