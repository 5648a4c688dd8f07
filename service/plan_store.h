#pragma once
// The planning service's store (Note [Planner store]): graphs, profiles and planning answers
// under content hashes in a directory, written atomically, read back after a restart, and kept
// under a size limit by evicting the least recently used entries (Note [Store eviction]).
//
// Note [Planner store]
// <dir>/graphs/<Graph::hash()>.graph, <dir>/profiles/<hash of the profile's payload>.profile and
// <dir>/plans/<plan key>.answer (a framed PlanAnswer), and <dir>/profile-keys/<hash of a
// profile_key>.key holding the hash of the last profile sent with that key. The plan key hashes
// everything a plan depends on: graph hash, profile hash, cluster, global batch, planner options
// and usage, so equal calls share an answer and any change plans again. Files are written through a
// temporary file and a rename (core::writeFileAtomically), so a crash or SIGTERM never leaves a
// half-written entry under its real name; an entry that cannot be read (corrupt, or written by
// another version) is reported, removed and treated as missing. A crash while writing leaves a
// temporary file instead, which the next store to open removes once its writer is gone. An empty
// directory name keeps everything in memory only.
//
// Note [Store eviction]
// With a limit (maxBytes > 0), a put that takes the store above it removes the least recently
// used entries until the store is at most 90% of the limit (so that a store at its limit does not
// evict on every put), never the entry just put. "Used" is a get() that found the entry, a
// contains() that found it, or a put(); on disk each use also sets the file's modification time,
// so the order survives a restart: the store is measured and ordered by modification time when it
// opens, and evicts then if it is already above the limit. An answer is self-contained (the
// deployment bytes, not references), so evicting a graph or profile never breaks a stored answer;
// a call that names an evicted graph or profile by hash is told to send the file, and a
// profile_key whose profile was evicted is NotStored (the job profiles and sends it again). All
// of it happens under the store's lock: a put and an eviction never overlap.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace autostage::service {

class PlanStore {
 public:
  // maxBytes: the size limit; 0 for none.
  explicit PlanStore(std::string directory, int64_t maxBytes = 0);
  // kind: "graphs", "profiles", "profile-keys" or "plans"; key: a hex hash. Thread-safe.
  std::optional<std::string> get(const std::string& kind, const std::string& key);
  // Whether the entry is stored (a use of it, as get()), without reading it.
  bool contains(const std::string& kind, const std::string& key);
  void put(const std::string& kind, const std::string& key, const std::string& bytes);
  // An entry its reader found damaged (truncated, corrupted, another version): its file is
  // removed and the entry forgotten, so it is reported once and the next put writes it again.
  void discard(const std::string& kind, const std::string& key);
  // Temporary files of writes that never finished (a service killed while it wrote), removed
  // when the store opened; their writers were gone (Note [Atomic writes]).
  int64_t removedTemporaries() const { return removedTemporaries_; }
  int64_t entries() const;
  int64_t bytes() const;
  int64_t evictions() const;  // entries removed to keep under the limit since the store opened
  int64_t maxBytes() const { return maxBytes_; }
  const std::string& directory() const { return directory_; }

 private:
  struct Entry {
    int64_t bytes = 0;
    uint64_t lastUse = 0;  // a counter of uses; larger is more recent
  };
  std::string pathOf(const std::string& kind, const std::string& key) const;
  std::string pathOf(const std::string& id) const;
  void touch(const std::string& id, Entry& entry);  // a use: ordering and the file's mtime
  void erase(const std::string& id);                // forget an entry (the file is gone)
  void evictLocked(const std::string& keep);        // Note [Store eviction]
  std::string directory_;
  const int64_t maxBytes_;
  mutable std::mutex mutex_;
  std::map<std::string, std::string> memory_;  // "kind/key" -> bytes, without a directory
  std::map<std::string, Entry> entries_;       // "kind/key" -> size and last use, everything stored
  int64_t totalBytes_ = 0;
  int64_t evictions_ = 0;
  int64_t removedTemporaries_ = 0;
  uint64_t useClock_ = 0;
};

}  // namespace autostage::service
