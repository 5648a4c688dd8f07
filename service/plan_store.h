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
// contains() or version() that found it, or a put(); on disk a use also sets the file's
// modification time (at most once a second per entry, so that an entry asked for by every call
// costs no syscall per call), so the order survives a restart, to the second: the store is
// measured and ordered by modification time when it opens, and evicts then if it is already
// above the limit. An answer is self-contained (the deployment bytes, not references), so
// evicting a graph or profile never breaks a stored answer; a call that names an evicted graph or
// profile by hash is told to send the file, and a profile_key whose profile was evicted is
// NotStored (the job profiles and sends it again).
//
// Note [Store locking]
// Readers (get, contains, version) share the store's lock and never wait for a file being
// written: a put writes its file (durably: fsyncs) holding only the writers' lock, then takes
// the store's lock exclusively for the moment it records the entry and evicts. Puts, discards
// and evictions are serialized by the writers' lock, so a put and an eviction never overlap. A
// reader that finds an entry while it is being put again reads the old bytes or the new ones
// (the rename is atomic) with the old version; either is a whole entry.

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>

namespace autostage::service {

class PlanStore {
 public:
  // maxBytes: the size limit; 0 for none.
  explicit PlanStore(std::string directory, int64_t maxBytes = 0);
  // kind: "graphs", "profiles", "profile-keys" or "plans"; key: a hex hash. Thread-safe.
  // With `version`, also the entry's version (see version()) the bytes were read as.
  std::optional<std::string> get(const std::string& kind, const std::string& key,
                                 uint64_t* version = nullptr);
  // Whether the entry is stored (a use of it, as get()), without reading it.
  bool contains(const std::string& kind, const std::string& key);
  // The entry's version when stored, without reading it (a use of it, as contains()): a number
  // given to an entry when it is put or found at open, never given again by this store. An entry
  // put again, discarded or evicted no longer has it, so a copy decoded from an entry is current
  // while its version is (Note [Answers from memory]).
  std::optional<uint64_t> version(const std::string& kind, const std::string& key);
  // Returns the version of the entry put; nullopt when its file could not be written (the entry
  // is then not stored, and the store still answers what it has).
  std::optional<uint64_t> put(const std::string& kind, const std::string& key,
                              const std::string& bytes);
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
    uint64_t version = 0;
    std::atomic<uint64_t> lastUse{0};                   // a counter of uses; larger is more recent
    std::atomic<int64_t> fileTimeSetMs{INT64_MIN / 2};  // when a use last set the file's mtime
  };
  std::string pathOf(const std::string& kind, const std::string& key) const;
  std::string pathOf(const std::string& id) const;
  // A use, under the shared lock: the order now. Returns whether the file's mtime is due
  // (Note [Store eviction]), which setFileTime() sets once the lock is released.
  bool touch(Entry& entry);
  void setFileTime(const std::string& kind, const std::string& key) const;
  // Under the exclusive lock:
  void record(const std::string& id, int64_t bytes, uint64_t version);  // a new or replaced entry
  void erase(const std::string& id);          // forget an entry (the file is gone)
  void evictLocked(const std::string& keep);  // Note [Store eviction]
  std::string directory_;
  const int64_t maxBytes_;
  std::mutex writeMutex_;                      // Note [Store locking]: puts, discards and evictions
  mutable std::shared_mutex mutex_;            // the maps and counters below
  std::map<std::string, std::string> memory_;  // "kind/key" -> bytes, without a directory
  std::map<std::string, Entry> entries_;       // "kind/key" -> size and last use, everything stored
  int64_t totalBytes_ = 0;
  int64_t evictions_ = 0;
  int64_t removedTemporaries_ = 0;
  uint64_t nextVersion_ = 0;
  std::atomic<uint64_t> useClock_{0};
};

}  // namespace autostage::service
