#pragma once
// Cluster spec files: core::ClusterSpec as TOML (hand-written, see cluster_spec.h) or as a framed
// Protobuf file (kind "cluster", version kClusterFormatVersion; cluster.proto).

#include <cstdint>
#include <string>

#include "core/cluster_spec.h"
#include "core/proto/cluster.pb.h"

namespace autostage::core {

inline constexpr const char* kClusterFileKind = "cluster";
inline constexpr uint32_t kClusterFormatVersion = 1;

proto::ClusterSpec toProto(const ClusterSpec& spec);
ClusterSpec fromProto(const proto::ClusterSpec& message);

// Framed bytes; decode validates (ConfigError naming `origin` and the bad field).
std::string encodeClusterSpec(const ClusterSpec& spec);
ClusterSpec decodeClusterSpec(const std::string& bytes,
                              const std::string& origin = "cluster bytes");

// Validates first (ConfigError), then writes atomically.
void saveClusterSpec(const ClusterSpec& spec, const std::string& path);
// Reads a framed cluster file or a TOML file, chosen by content: a file that starts with the
// framed-file header (or holds a NUL byte) is Protobuf, anything else is TOML. Validates.
// Throws FormatError for a bad framed file, ConfigError for bad TOML or an invalid spec.
ClusterSpec loadClusterSpec(const std::string& path);

}  // namespace autostage::core
