#include "core/proto/file_format.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

// Note [Atomic writes]
// The bytes go to a temporary file next to `path` (same file system, so the rename is atomic),
// which is fsynced before the rename and whose directory is fsynced after it: a crash at any
// point leaves either the complete old file or the complete new one under `path`, never a
// partial one. The temporary name is unique per process and call (pid + counter), so threads
// writing the same path do not share a temporary file. Any failure removes the temporary file.
// Without `durable` (files rewritten often, e.g. the runtime's event traces) both fsyncs are
// skipped: readers still never see a partial file, but a crash may lose the latest version.
int atomicWriteTemporaryPid(const std::string& filename) {
  // <name>.tmp-<pid>-<counter>, as written below.
  const size_t at = filename.rfind(".tmp-");
  if (at == std::string::npos || at == 0) return -1;
  const std::string rest = filename.substr(at + 5);
  const size_t dash = rest.find('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 == rest.size() || dash > 9) return -1;
  const auto digits = [](const std::string& text) {
    return std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(rest.substr(0, dash)) || !digits(rest.substr(dash + 1))) return -1;
  return std::stoi(rest.substr(0, dash));
}

void writeFileAtomically(const std::string& path, const std::string& bytes,
                         const std::string& kind, bool durable) {
  static std::atomic<unsigned> counter{0};
  std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  auto fail = [&](const std::string& what, int err) {
    std::remove(tmp.c_str());
    throw FormatError("cannot write " + kind + " file '" + path + "' (" + what + " '" + tmp +
                      "'): " + std::strerror(err) +
                      "; check the directory exists, is writable and has space");
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    int err = errno;  // nothing was created: do not remove another writer's file
    throw FormatError("cannot write " + kind + " file '" + path + "' (creating temporary '" + tmp +
                      "'): " + std::strerror(err) + "; check the directory exists and is writable");
  }
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      fail("writing temporary", err);
    }
    done += static_cast<size_t>(n);
  }
  if (durable && ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    fail("syncing temporary", err);
  }
  if (::close(fd) != 0) fail("closing temporary", errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    throw FormatError("cannot move '" + tmp + "' to '" + path + "': " + std::strerror(err));
  }
  if (!durable) return;
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  int dirFd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {  // best effort: the file is complete under its name either way
    ::fsync(dirFd);
    ::close(dirFd);
  }
}

void writeFramedFile(const std::string& path, const std::string& kind, uint32_t formatVersion,
                     const std::string& payload) {
  writeFileAtomically(path, encodeFramed(kind, formatVersion, payload), kind, true);
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
