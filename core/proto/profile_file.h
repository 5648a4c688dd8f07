#pragma once
// Profile files: core::GraphProfile <-> proto::GraphProfile (profile.proto) <-> framed bytes.
// Kind "profile", version kProfileFormatVersion. Used as the profiler's cache: loadProfileFor
// refuses a profile measured for another graph, device or dtype instead of silently reusing it.

#include <cstdint>
#include <string>

#include "core/profile.h"
#include "core/proto/profile.pb.h"

namespace autostage::core {

inline constexpr const char* kProfileFileKind = "profile";
inline constexpr uint32_t kProfileFormatVersion = 1;

proto::GraphProfile toProto(const GraphProfile& profile);
// Throws FormatError naming `origin` when node entries are not indexed by node id
// (nodes[i].node must be i, or kNoNode for an entry nobody filled).
GraphProfile fromProto(const proto::GraphProfile& message, const std::string& origin);

std::string encodeProfile(const GraphProfile& profile);
GraphProfile decodeProfile(const std::string& bytes, const std::string& origin = "profile bytes");

void saveProfile(const GraphProfile& profile, const std::string& path);
GraphProfile loadProfile(const std::string& path);
// Loads and checks that the profile belongs to this graph, device and dtype; otherwise throws
// FormatError naming every differing field with the expected and the found value.
GraphProfile loadProfileFor(const std::string& path, const std::string& graphHash,
                            const std::string& deviceKind, const std::string& dtype);

}  // namespace autostage::core
