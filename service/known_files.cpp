#include "service/known_files.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace autostage::service {

// A few KiB of the file, spread over it, and its size: two files of one model differ somewhere
// in those (a different size, header, tail or sample), and a rare false candidate costs one
// comparison that fails.
uint64_t KnownFiles::fingerprint(const std::string& kind, const std::string& bytes) {
  constexpr size_t kEdge = 4096, kSamples = 32, kSample = 64;
  const std::hash<std::string_view> hash;
  const std::string_view all(bytes);
  uint64_t h = hash(kind) ^ (static_cast<uint64_t>(all.size()) * 0x9e3779b97f4a7c15ULL);
  auto mix = [&](std::string_view piece) { h = (h ^ hash(piece)) * 0x100000001b3ULL; };
  if (all.size() <= 4 * kEdge) {
    mix(all);
    return h;
  }
  mix(all.substr(0, kEdge));
  mix(all.substr(all.size() - kEdge));
  for (size_t i = 1; i <= kSamples; ++i) mix(all.substr(all.size() / (kSamples + 1) * i, kSample));
  return h;
}

KnownFiles::Map::const_iterator KnownFiles::findLocked(const std::string& kind,
                                                       const std::string& bytes) const {
  auto [first, last] = known_.equal_range(fingerprint(kind, bytes));
  for (auto it = first; it != last; ++it)
    if (it->second.kind == kind && it->second.bytes == bytes) return it;
  return known_.end();
}

std::optional<std::string> KnownFiles::find(const std::string& kind,
                                            const std::string& bytes) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto found = findLocked(kind, bytes);
  if (found == known_.end()) return std::nullopt;
  found->second.lastUse = ++useClock_;
  return found->second.hash;
}

void KnownFiles::add(const std::string& kind, const std::string& bytes, const std::string& hash) {
  const int64_t size = static_cast<int64_t>(bytes.size());
  std::unique_lock<std::shared_mutex> lock(mutex_);
  auto found = findLocked(kind, bytes);
  if (found != known_.end()) {
    totalBytes_ -= size;
    known_.erase(found);
  }
  if (size > maxBytes_) return;
  auto added =
      known_.emplace(std::piecewise_construct, std::forward_as_tuple(fingerprint(kind, bytes)),
                     std::forward_as_tuple(kind, bytes, hash));
  added->second.lastUse = ++useClock_;
  totalBytes_ += size;
  if (totalBytes_ > maxBytes_) evictLocked(&added->second);
}

// The least recently matched files go until the rest fit, never the one just added.
void KnownFiles::evictLocked(const Known* keep) {
  std::vector<std::pair<uint64_t, Map::iterator>> byUse;
  for (auto it = known_.begin(); it != known_.end(); ++it)
    if (&it->second != keep) byUse.emplace_back(it->second.lastUse.load(), it);
  std::sort(byUse.begin(), byUse.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [lastUse, it] : byUse) {
    if (totalBytes_ <= maxBytes_) break;
    totalBytes_ -= static_cast<int64_t>(it->second.bytes.size());
    known_.erase(it);
  }
}

int64_t KnownFiles::entries() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return static_cast<int64_t>(known_.size());
}

int64_t KnownFiles::bytes() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return totalBytes_;
}

}  // namespace autostage::service
