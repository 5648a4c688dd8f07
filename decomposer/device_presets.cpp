// Device presets; see Note [Device presets] in device_presets.h.
#include "decomposer/device_presets.h"

#include <algorithm>

#include "core/error.h"
#include "decomposer/synthetic.h"

namespace autostage::decomposer {
namespace {

constexpr double kMiB = 1048576.0;
constexpr double kTera = 1e12;
constexpr double kGB = 1e9;

const std::vector<DevicePreset>& presets() {
  // name, model, memory, fp32 / bf16 / fp16 dense peaks, HBM, NVLink per direction, network.
  static const std::vector<DevicePreset> all = {
      {"a100-40gb", "synthetic:NVIDIA A100-SXM4-40GB", 40960 * kMiB, 19.5 * kTera, 312 * kTera,
       312 * kTera, 1555 * kGB, 300 * kGB, 25 * kGB},
      {"a100-80gb", "synthetic:NVIDIA A100-SXM4-80GB", 81920 * kMiB, 19.5 * kTera, 312 * kTera,
       312 * kTera, 2039 * kGB, 300 * kGB, 25 * kGB},
      {"h100-80gb", "synthetic:NVIDIA H100 80GB HBM3", 81559 * kMiB, 67 * kTera, 989.4 * kTera,
       989.4 * kTera, 3350 * kGB, 450 * kGB, 50 * kGB},
      {"h200", "synthetic:NVIDIA H200", 143771 * kMiB, 67 * kTera, 989.4 * kTera, 989.4 * kTera,
       4800 * kGB, 450 * kGB, 50 * kGB},
  };
  return all;
}

}  // namespace

double DevicePreset::peakFlops(const std::string& precision) const {
  if (precision == "fp32") return peakFp32;
  if (precision == "bf16") return peakBf16;
  if (precision == "fp16") return peakFp16;
  throw ConfigError("precision '" + precision + "' is unknown; use fp32, bf16 or fp16");
}

DeviceModel DevicePreset::deviceModel(const std::string& precision) const {
  DeviceModel d;
  d.kind = model;
  d.peakFlops = peakFlops(precision);
  d.efficiency = kComputeEfficiency;
  d.memoryBandwidth = hbmBytesPerSecond * kMemoryEfficiency;
  d.roofline = true;
  // Mixed precision keeps fp32 parameters and runs the layers in the low-precision type.
  d.parameterType = core::DType::Float32;
  d.activationType = precision == "fp32"   ? core::DType::Float32
                     : precision == "bf16" ? core::DType::BFloat16
                                           : core::DType::Float16;
  return d;
}

core::CommProfile DevicePreset::comm() const {
  core::CommProfile c;
  c.p2pIntraNode = c.allreduceIntraNode = {5e-6, nvlinkBytesPerSecond * kLinkEfficiency};
  c.p2pInterNode = {20e-6, networkBytesPerSecond * kLinkEfficiency};
  // Note [Device presets]: NCCL's rings between servers run one per network port, so a
  // server's ports together carry the allreduce, up to what NVLink carries inside it.
  const double serverNetwork = devicesPerServer * networkBytesPerSecond;
  c.allreduceInterNode = {20e-6, std::min(serverNetwork, nvlinkBytesPerSecond) * kLinkEfficiency};
  return c;
}

const DevicePreset& devicePreset(const std::string& name) {
  for (const DevicePreset& p : presets())
    if (p.name == name) return p;
  std::string known;
  for (const DevicePreset& p : presets()) known += (known.empty() ? "" : ", ") + p.name;
  throw ConfigError("device preset '" + name + "' is unknown; known: " + known);
}

std::vector<std::string> devicePresetNames() {
  std::vector<std::string> names;
  for (const DevicePreset& p : presets()) names.push_back(p.name);
  return names;
}

}  // namespace autostage::decomposer
