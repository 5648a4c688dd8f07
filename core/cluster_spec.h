#pragma once
// The hardware to plan for: possibly not the machine we run on (offline planning).
// Loadable from TOML (cluster_spec.cpp) and Protobuf (core/proto/cluster_file.h).
//
// TOML form:
//   device_kind = "a100-40g"
//   devices = 32
//   devices_per_node = 8
//   memory_per_device = "40GiB"     # or an integer byte count
//   intra_node_bandwidth = 300e9    # bytes/s
//   inter_node_bandwidth = 25e9
//   latency = 5e-6                  # seconds
//   peak_flops = 312e12

#include <cstdint>
#include <string>

namespace autostage::core {

// mem_limit_gb and other GiB figures in bytes: the one conversion (1 GiB = 2^30 bytes).
inline double gibToBytes(double gib) { return gib * 1073741824.0; }

struct ClusterSpec {
  std::string deviceKind = "cpu";
  int devices = 1;
  int devicesPerNode = 1;
  int64_t memoryPerDevice = 0;  // bytes
  double intraNodeBandwidth = 10e9;  // bytes/s
  double interNodeBandwidth = 10e9;
  double latencySeconds = 20e-6;
  double peakFlops = 1e12;

  int nodes() const { return (devices + devicesPerNode - 1) / devicesPerNode; }
  // Throws ConfigError naming the first bad field and what would be valid.
  void validate() const;
  std::string toString() const;
  static ClusterSpec fromToml(const std::string& text, const std::string& origin);
  bool operator==(const ClusterSpec& o) const;
};

// Parses "40GiB", "512MiB", "1.5GB", "123456" (bytes). Throws ConfigError on anything else.
int64_t parseByteSize(const std::string& text, const std::string& what);
// "1.50 GiB"-style rendering for logs.
std::string formatBytes(double bytes);

}  // namespace autostage::core
