#include "core/proto/file_format.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "autostage/build_config.h"
#include "core/error.h"
#include "core/ir/graph.h"
#include "core/proto/envelope.pb.h"

namespace autostage::core {
namespace {
constexpr const char* kMagic = "autostage";
}

// Note [File validation]
// A file is checked in the order that gives the most useful message: can it be opened; does it
// parse as an envelope with our magic (else "not an autostage file" or "truncated/corrupted");
// is it the expected kind; is its version one we read; does the payload hash match (else
// "corrupted"). Protobuf happily parses some truncated inputs, so the hash is what catches a
// payload cut short; an empty or missing magic catches a truncated envelope.
std::string encodeFramed(const std::string& kind, uint32_t formatVersion, const std::string& payload) {
  proto::FileEnvelope envelope;
  envelope.set_magic(kMagic);
  envelope.set_format_version(formatVersion);
  envelope.set_kind(kind);
  envelope.set_payload_hash(fnv1aHex(payload));
  envelope.set_writer_version(AUTOSTAGE_VERSION);
  envelope.set_payload(payload);
  return envelope.SerializeAsString();
}

void writeFramedFile(const std::string& path, const std::string& kind, uint32_t formatVersion,
                     const std::string& payload) {
  std::string bytes = encodeFramed(kind, formatVersion, payload);
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw FormatError("cannot write " + kind + " file '" + path + "' (temporary '" + tmp +
                        "'): " + std::strerror(errno) + "; check the directory exists and has space");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    throw FormatError("cannot move '" + tmp + "' to '" + path + "': " + std::strerror(err));
  }
}

FramedPayload decodeFramed(const std::string& bytes, const std::string& expectedKind,
                           uint32_t supportedVersion, const std::string& origin) {
  proto::FileEnvelope envelope;
  bool parsed = envelope.ParseFromString(bytes);
  if (!parsed || envelope.magic() != kMagic) {
    bool looksOurs = bytes.find(kMagic) != std::string::npos;
    throw FormatError(origin + ": " +
                      (bytes.empty() ? std::string("file is empty")
                       : looksOurs   ? "file is truncated or corrupted (envelope does not parse)"
                                     : "not an autostage file (no 'autostage' header)") +
                      "; expected a " + expectedKind + " file");
  }
  if (envelope.kind() != expectedKind)
    throw FormatError(origin + ": is a " + envelope.kind() + " file, expected a " + expectedKind +
                      " file");
  if (envelope.format_version() != supportedVersion)
    throw FormatError(origin + ": " + expectedKind + " format version " +
                      std::to_string(envelope.format_version()) + " (written by autostage " +
                      envelope.writer_version() + "), this build reads version " +
                      std::to_string(supportedVersion) + "; regenerate the file with this build");
  if (fnv1aHex(envelope.payload()) != envelope.payload_hash())
    throw FormatError(origin + ": " + expectedKind +
                      " file is corrupted or truncated (payload hash " +
                      fnv1aHex(envelope.payload()) + " does not match recorded " +
                      envelope.payload_hash() + ")");
  return {envelope.kind(), envelope.format_version(), envelope.writer_version(), envelope.payload()};
}

FramedPayload readFramedFile(const std::string& path, const std::string& expectedKind,
                             uint32_t supportedVersion) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw FormatError("cannot open " + expectedKind + " file '" + path + "': " + std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return decodeFramed(buffer.str(), expectedKind, supportedVersion, "'" + path + "'");
}

}  // namespace autostage::core
