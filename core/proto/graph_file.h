#pragma once
// Graph files: core::Graph <-> proto::Graph (graph.proto) <-> framed bytes (file_format.h).
//
// The encoding is faithful: decode(encode(g)) has the same toString() (hence the same hash()),
// and encoding the same graph twice gives identical bytes. Decoding rebuilds the graph through
// Graph's public builder API and verify()s it; any inconsistency in the message (unknown enum,
// value id out of range, output ids not dense, duplicate value name, ...) is a FormatError naming
// the origin and the node or value, never a crash or an InternalError.

#include <cstdint>
#include <string>

#include "core/ir/graph.h"
#include "core/proto/graph.pb.h"

namespace autostage::core {

inline constexpr const char* kGraphFileKind = "graph";
inline constexpr uint32_t kGraphFormatVersion = 1;

proto::Graph toProto(const Graph& graph);
// `origin` (a path or "graph bytes from rank 0") prefixes every error message.
Graph fromProto(const proto::Graph& message, const std::string& origin);

// Framed bytes (kind "graph", version kGraphFormatVersion), e.g. for sending over the wire.
std::string encodeGraph(const Graph& graph);
Graph decodeGraph(const std::string& bytes, const std::string& origin = "graph bytes");

// Atomic write (see writeFramedFile); load throws FormatError for any bad or foreign file.
void saveGraph(const Graph& graph, const std::string& path);
Graph loadGraph(const std::string& path);

}  // namespace autostage::core
