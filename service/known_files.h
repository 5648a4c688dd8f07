#pragma once
// The content hashes of file bytes decoded before (Note [Answers from memory]): a call's graph
// bytes -> its graph hash, its profile bytes -> the profile hash, so a call sending the files of
// a model seen before is resolved without decoding or hashing them again. A match compares every
// byte (at memory speed, far less than hashing them; and no two files share a hash by chance); a
// sampled fingerprint only finds the candidates.
// Bounded in bytes: above the bound the least recently matched go (they are decoded again when
// sent). Thread-safe; finding shares the lock.

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>

namespace autostage::service {

class KnownFiles {
 public:
  // maxBytes: the bound; a file larger than it on its own is not kept.
  explicit KnownFiles(int64_t maxBytes) : maxBytes_(maxBytes) {}
  // The hash added for exactly these bytes of `kind` ("graph", "profile"); none if not known.
  std::optional<std::string> find(const std::string& kind, const std::string& bytes) const;
  void add(const std::string& kind, const std::string& bytes, const std::string& hash);
  int64_t entries() const;
  int64_t bytes() const;  // of the files kept

 private:
  struct Known {
    Known(std::string kind, std::string bytes, std::string hash)
        : kind(std::move(kind)), bytes(std::move(bytes)), hash(std::move(hash)) {}
    const std::string kind, bytes;
    std::string hash;
    mutable std::atomic<uint64_t> lastUse{0};  // set under the shared lock
  };
  using Map = std::multimap<uint64_t, Known>;  // by fingerprint
  static uint64_t fingerprint(const std::string& kind, const std::string& bytes);
  Map::const_iterator findLocked(const std::string& kind, const std::string& bytes) const;
  void evictLocked(const Known* keep);

  const int64_t maxBytes_;
  mutable std::shared_mutex mutex_;
  Map known_;
  int64_t totalBytes_ = 0;
  mutable std::atomic<uint64_t> useClock_{0};
};

}  // namespace autostage::service
