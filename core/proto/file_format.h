#pragma once
// Framed, versioned, hashed files for every autostage format (graph, profile, cluster spec,
// deployment). See Note [File validation].
//
// writeFramedFile writes to `path + ".tmp-<pid>-<n>"`, fsyncs it and renames it over `path`, so a
// crash or a full disk never leaves a half-written file under the real name; the old file survives
// a failed write and no temporary file is left behind (Note [Atomic writes]). readFramedFile throws FormatError saying which check failed: missing file, not an
// autostage file, truncated/corrupted, wrong kind, unsupported version, hash mismatch.

#include <cstdint>
#include <string>

namespace autostage::core {

struct FramedPayload {
  std::string kind;
  uint32_t formatVersion = 0;
  std::string writerVersion;
  std::string payload;
};

// Writes `bytes` to `path` through a temporary file and a rename (Note [Atomic writes]); with
// `durable` the file and its directory are fsynced. `kind` names the file in errors. Throws
// FormatError if the file cannot be written; the old file is then untouched.
void writeFileAtomically(const std::string& path, const std::string& bytes,
                         const std::string& kind, bool durable = true);

// When `filename` (no directory) is a temporary file of writeFileAtomically, the pid of the
// process that wrote it; else -1. A temporary file whose writer is gone was left by a crash
// (Note [Atomic writes]) and may be removed.
int atomicWriteTemporaryPid(const std::string& filename);

// Wraps `payload` and writes it atomically. Throws FormatError if the file cannot be written.
void writeFramedFile(const std::string& path, const std::string& kind, uint32_t formatVersion,
                     const std::string& payload);
// Encodes without writing (for tests and for sending over the wire).
std::string encodeFramed(const std::string& kind, uint32_t formatVersion, const std::string& payload);

// Reads and validates; `expectedKind` and `supportedVersion` must match exactly.
FramedPayload readFramedFile(const std::string& path, const std::string& expectedKind,
                             uint32_t supportedVersion);
FramedPayload decodeFramed(const std::string& bytes, const std::string& expectedKind,
                           uint32_t supportedVersion, const std::string& origin);

// Parses a payload into a protobuf message, turning failure into a FormatError naming `origin`.
template <typename Message>
Message parsePayload(const FramedPayload& framed, const std::string& origin);

}  // namespace autostage::core

#include "core/proto/file_format_inl.h"
