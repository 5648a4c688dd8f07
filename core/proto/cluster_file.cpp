#include "core/proto/cluster_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/proto/file_format.h"

namespace autostage::core {
namespace {

// A framed file is a serialized FileEnvelope whose first field is magic = "autostage": tag 0x0a
// (field 1, length-delimited), length 9, then the magic itself.
const std::string kFramedPrefix = std::string("\x0a\x09", 2) + "autostage";

bool looksFramed(const std::string& bytes) {
  return bytes.compare(0, kFramedPrefix.size(), kFramedPrefix) == 0 ||
         bytes.find('\0') != std::string::npos;
}

ClusterSpec validated(ClusterSpec spec, const std::string& origin) {
  try {
    spec.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(origin + ": " + e.what());
  }
  return spec;
}

}  // namespace

proto::ClusterSpec toProto(const ClusterSpec& spec) {
  proto::ClusterSpec out;
  out.set_device_kind(spec.deviceKind);
  out.set_devices(spec.devices);
  out.set_devices_per_node(spec.devicesPerNode);
  out.set_memory_per_device(spec.memoryPerDevice);
  out.set_intra_node_bandwidth(spec.intraNodeBandwidth);
  out.set_inter_node_bandwidth(spec.interNodeBandwidth);
  out.set_latency_seconds(spec.latencySeconds);
  out.set_peak_flops(spec.peakFlops);
  return out;
}

ClusterSpec fromProto(const proto::ClusterSpec& message) {
  ClusterSpec spec;
  spec.deviceKind = message.device_kind();
  spec.devices = message.devices();
  spec.devicesPerNode = message.devices_per_node();
  spec.memoryPerDevice = message.memory_per_device();
  spec.intraNodeBandwidth = message.intra_node_bandwidth();
  spec.interNodeBandwidth = message.inter_node_bandwidth();
  spec.latencySeconds = message.latency_seconds();
  spec.peakFlops = message.peak_flops();
  return spec;
}

std::string encodeClusterSpec(const ClusterSpec& spec) {
  return encodeFramed(kClusterFileKind, kClusterFormatVersion, toProto(spec).SerializeAsString());
}

ClusterSpec decodeClusterSpec(const std::string& bytes, const std::string& origin) {
  FramedPayload framed = decodeFramed(bytes, kClusterFileKind, kClusterFormatVersion, origin);
  return validated(fromProto(parsePayload<proto::ClusterSpec>(framed, origin)), origin);
}

void saveClusterSpec(const ClusterSpec& spec, const std::string& path) {
  validated(spec, "cluster spec to save to '" + path + "'");
  writeFramedFile(path, kClusterFileKind, kClusterFormatVersion, toProto(spec).SerializeAsString());
}

ClusterSpec loadClusterSpec(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw FormatError("cannot open cluster spec file '" + path + "': " + std::strerror(errno) +
                      "; pass a TOML file (see cluster_spec.h) or a saved cluster file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string bytes = buffer.str();
  std::string origin = "'" + path + "'";
  if (looksFramed(bytes)) return decodeClusterSpec(bytes, origin);
  return ClusterSpec::fromToml(bytes, origin);
}

}  // namespace autostage::core
