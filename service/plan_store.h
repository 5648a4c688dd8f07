#pragma once
// The planning service's store (Note [Planner store]): graphs, profiles and planning answers
// under content hashes in a directory, written atomically, read back after a restart.
//
// Note [Planner store]
// <dir>/graphs/<Graph::hash()>.graph, <dir>/profiles/<hash of the profile's payload>.profile and
// <dir>/plans/<plan key>.answer (a framed PlanAnswer), and <dir>/profile-keys/<hash of a
// profile_key>.key holding the hash of the last profile sent with that key. The plan key hashes
// everything a plan depends on: graph hash, profile hash, cluster, global batch, planner options
// and usage, so equal calls share an answer and any change plans again. Files are written through a
// temporary file and a rename (core::writeFileAtomically), so a crash or SIGTERM never leaves a
// half-written entry under its real name; an entry that cannot be read (corrupt, or written by
// another version) is reported and treated as missing. An empty directory name keeps everything in
// memory only.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace autostage::service {

class PlanStore {
 public:
  explicit PlanStore(std::string directory);
  // kind: "graphs", "profiles", "profile-keys" or "plans"; key: a hex hash. Thread-safe.
  std::optional<std::string> get(const std::string& kind, const std::string& key);
  void put(const std::string& kind, const std::string& key, const std::string& bytes);
  int64_t entries() const;
  int64_t bytes() const;
  const std::string& directory() const { return directory_; }

 private:
  std::string pathOf(const std::string& kind, const std::string& key) const;
  std::string directory_;
  mutable std::mutex mutex_;
  std::map<std::string, std::string> memory_;  // "kind/key" -> bytes, without a directory
  std::map<std::string, int64_t> sizes_;       // "kind/key" -> bytes, everything stored
};

}  // namespace autostage::service
