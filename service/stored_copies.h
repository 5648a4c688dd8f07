#pragma once
// Copies of store entries decoded once and kept in memory (Note [Answers from memory]), each
// tagged with the version of the entry it was decoded from (PlanStore::version); read() is the
// one place that decides whether a copy is current. Bounded in bytes: above the bound the least
// recently used copies go (they are decoded again when asked). Thread-safe; finding a copy
// shares the lock, so readers do not wait for each other.
//
// Note [Answers from memory]
// The store on disk stays the truth (Note [Planner store]): what the planning core decoded from
// an entry (a verified PlanAnswer, a profile key's profile hash) is kept here and used only while
// the store still holds the very version it was decoded from. An entry put again, discarded as
// damaged or evicted has another version or none, so its copy is decoded again or dropped, never
// served in its place; a copy is filled when the core puts an entry or first reads it. A store
// file damaged on disk while the service runs is therefore found at the next restart (or when
// its copy is dropped), not by the calls meanwhile, which get the answer as it was verified. A
// call's graph and profile bytes are matched against the bytes seen before (KnownFiles) for the
// same reason: to do once what every stored answer would otherwise repeat.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "service/plan_store.h"

namespace autostage::service {

template <typename T>
class StoredCopies {
 public:
  // maxBytes: the bound; a copy larger than it on its own is not kept.
  explicit StoredCopies(int64_t maxBytes) : maxBytes_(maxBytes) {}

  // The store's entry `kind`/`key` as `decode(bytes)` made it (a shared_ptr<const T>): the copy
  // kept while the entry has the version it was decoded from, else decoded from the store's bytes
  // now and kept. Null when the store has no such entry (its copy is dropped then). A decode that
  // throws keeps nothing and the exception goes to the caller.
  template <typename Decode>
  std::shared_ptr<const T> read(PlanStore& store, const std::string& kind, const std::string& key,
                                Decode&& decode) {
    const std::optional<uint64_t> version = store.version(kind, key);
    if (!version) {
      erase(key);
      return nullptr;
    }
    if (auto copy = find(key, *version)) return copy;
    uint64_t read = 0;
    const std::optional<std::string> bytes = store.get(kind, key, &read);
    if (!bytes) return nullptr;
    std::shared_ptr<const T> value = decode(*bytes);
    put(key, read, value, static_cast<int64_t>(bytes->size()));
    return value;
  }

  // The copy of `key` decoded from `version` of its entry; null when there is none, or only
  // one of another version.
  std::shared_ptr<const T> find(const std::string& key, uint64_t version) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto found = copies_.find(key);
    if (found == copies_.end() || found->second.version != version) return nullptr;
    found->second.lastUse = ++useClock_;
    return found->second.value;
  }

  // Keeps `value`, about `bytes` bytes, as the copy of `key` decoded from `version`, in place
  // of any other copy of `key`.
  void put(const std::string& key, uint64_t version, std::shared_ptr<const T> value,
           int64_t bytes) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    eraseLocked(key);
    if (bytes > maxBytes_) return;
    Copy& copy = copies_[key];
    copy.version = version;
    copy.value = std::move(value);
    copy.bytes = bytes;
    copy.lastUse = ++useClock_;
    totalBytes_ += bytes;
    if (totalBytes_ > maxBytes_) evictLocked(key);
  }

  // Drops the copy of `key` (its entry is gone from the store).
  void erase(const std::string& key) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    eraseLocked(key);
  }

  int64_t entries() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return static_cast<int64_t>(copies_.size());
  }
  int64_t bytes() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return totalBytes_;
  }

 private:
  struct Copy {
    uint64_t version = 0;
    std::shared_ptr<const T> value;
    int64_t bytes = 0;
    mutable std::atomic<uint64_t> lastUse{0};  // set under the shared lock
  };

  void eraseLocked(const std::string& key) {
    auto found = copies_.find(key);
    if (found == copies_.end()) return;
    totalBytes_ -= found->second.bytes;
    copies_.erase(found);
  }

  // The least recently used copies go until the copies fit, never the one just put.
  void evictLocked(const std::string& keep) {
    std::vector<std::pair<uint64_t, std::string>> byUse;
    for (const auto& [key, copy] : copies_)
      if (key != keep) byUse.emplace_back(copy.lastUse.load(), key);
    std::sort(byUse.begin(), byUse.end());
    for (const auto& [lastUse, key] : byUse) {
      if (totalBytes_ <= maxBytes_) break;
      eraseLocked(key);
    }
  }

  const int64_t maxBytes_;
  mutable std::shared_mutex mutex_;
  std::map<std::string, Copy> copies_;
  int64_t totalBytes_ = 0;
  mutable std::atomic<uint64_t> useClock_{0};
};

}  // namespace autostage::service
