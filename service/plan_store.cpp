#include "service/plan_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/proto/file_format.h"

namespace autostage::service {
namespace {

const char* kKinds[] = {"graphs", "profiles", "profile-keys", "plans"};
const char* extensionOf(const std::string& kind) {
  return kind == "graphs"         ? ".graph"
         : kind == "profiles"     ? ".profile"
         : kind == "profile-keys" ? ".key"
                                  : ".answer";
}

bool isHexKey(const std::string& key) {
  return !key.empty() && key.size() <= 64 &&
         key.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// "512 bytes", "3.6 KiB", "12.0 MiB": for the eviction log line.
std::string sizeText(int64_t bytes) {
  char text[32];
  if (bytes < 1024)
    std::snprintf(text, sizeof text, "%lld bytes", static_cast<long long>(bytes));
  else if (bytes < (1 << 20))
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / 1024);
  else
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// Removes `path` when it is the temporary file of a write whose process is gone (Note [Atomic
// writes]: a crash leaves it behind); a live writer's (another service on this store) stays.
bool removeIfStaleTemporary(const std::filesystem::path& path) {
  const int pid = core::atomicWriteTemporaryPid(path.filename().string());
  if (pid <= 0 || (::kill(pid, 0) == 0 || errno != ESRCH)) return false;
  std::error_code error;
  return std::filesystem::remove(path, error);
}

}  // namespace

PlanStore::PlanStore(std::string directory, int64_t maxBytes)
    : directory_(std::move(directory)), maxBytes_(maxBytes) {
  AUTOSTAGE_CHECK_AS(ConfigError, maxBytes_ >= 0, "the store's size limit must be >= 0 (0: none)");
  if (directory_.empty()) return;
  namespace fs = std::filesystem;
  std::error_code error;
  // Note [Store eviction]: the entries in the order of their last use before the restart.
  std::vector<std::tuple<fs::file_time_type, std::string, int64_t>> found;
  for (const char* kind : kKinds) {
    fs::path dir = fs::path(directory_) / kind;
    fs::create_directories(dir, error);
    AUTOSTAGE_CHECK_AS(ConfigError, !error, "cannot create the store directory ", dir.string(),
                       ": ", error.message(), "; pass --store a directory this user can write");
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (removeIfStaleTemporary(entry.path())) {
        ++removedTemporaries_;
        continue;
      }
      if (entry.path().extension() != extensionOf(kind) || !entry.is_regular_file()) continue;
      found.emplace_back(entry.last_write_time(error),
                         std::string(kind) + "/" + entry.path().stem().string(),
                         static_cast<int64_t>(entry.file_size()));
    }
  }
  if (removedTemporaries_ > 0)
    core::logger("Service")->info("removed {} temporary file(s) of unfinished writes from the "
                                  "store (a service stopped while writing)", removedTemporaries_);
  std::sort(found.begin(), found.end());
  std::unique_lock<std::shared_mutex> lock(mutex_);
  for (const auto& [time, id, size] : found) record(id, size, ++nextVersion_);
  if (maxBytes_ > 0 && totalBytes_ > maxBytes_) evictLocked("");
}

std::string PlanStore::pathOf(const std::string& kind, const std::string& key) const {
  return directory_ + "/" + kind + "/" + key + extensionOf(kind);
}

std::string PlanStore::pathOf(const std::string& id) const {
  const size_t slash = id.find('/');
  return pathOf(id.substr(0, slash), id.substr(slash + 1));
}

bool PlanStore::touch(Entry& entry) {
  entry.lastUse = ++useClock_;
  if (directory_.empty()) return false;
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = entry.fileTimeSetMs.load();
  return now - last >= 1000 && entry.fileTimeSetMs.compare_exchange_strong(last, now);
}

void PlanStore::setFileTime(const std::string& kind, const std::string& key) const {
  // The file's mtime carries the order across a restart; a failure (the entry evicted since)
  // only loses that order.
  if (!directory_.empty()) ::utimensat(AT_FDCWD, pathOf(kind, key).c_str(), nullptr, 0);
}

void PlanStore::record(const std::string& id, int64_t bytes, uint64_t version) {
  erase(id);
  Entry& entry = entries_[id];
  entry.bytes = bytes;
  entry.version = version;
  entry.lastUse = ++useClock_;
  totalBytes_ += bytes;
}

void PlanStore::erase(const std::string& id) {
  auto found = entries_.find(id);
  if (found == entries_.end()) return;
  totalBytes_ -= found->second.bytes;
  entries_.erase(found);
  memory_.erase(id);
}

void PlanStore::discard(const std::string& kind, const std::string& key) {
  AUTOSTAGE_CHECK_AS(FormatError, isHexKey(key), "'", key, "' is not a store key (hex digits)");
  std::lock_guard<std::mutex> writing(writeMutex_);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  erase(kind + "/" + key);
  if (!directory_.empty()) std::remove(pathOf(kind, key).c_str());
}

std::optional<std::string> PlanStore::get(const std::string& kind, const std::string& key,
                                          uint64_t* version) {
  AUTOSTAGE_CHECK_AS(FormatError, isHexKey(key), "'", key, "' is not a store key (hex digits)");
  const std::string id = kind + "/" + key;
  std::optional<std::string> bytes;
  uint64_t readVersion = 0;
  bool setTime = false;
  {
    // Note [Store locking]: the file is read under the shared lock, so it is not removed
    // (evicted, discarded: both take the lock exclusively) while it is read.
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto found = entries_.find(id);
    if (found == entries_.end()) return std::nullopt;
    readVersion = found->second.version;
    if (version) *version = readVersion;
    if (directory_.empty()) {
      touch(found->second);
      return memory_.at(id);
    }
    std::ifstream in(pathOf(kind, key), std::ios::binary);
    if (in) {
      setTime = touch(found->second);
      std::ostringstream read;
      read << in.rdbuf();
      bytes = std::move(read).str();
    }
  }
  if (!bytes) {
    core::logger("Service")->warn("store entry {} cannot be read: treated as missing", id);
    std::lock_guard<std::mutex> writing(writeMutex_);
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto found = entries_.find(id);  // not one put again meanwhile
    if (found != entries_.end() && found->second.version == readVersion) erase(id);
    return std::nullopt;
  }
  if (setTime) setFileTime(kind, key);
  return bytes;
}

std::optional<uint64_t> PlanStore::version(const std::string& kind, const std::string& key) {
  AUTOSTAGE_CHECK_AS(FormatError, isHexKey(key), "'", key, "' is not a store key (hex digits)");
  std::optional<uint64_t> version;
  bool setTime = false;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto found = entries_.find(kind + "/" + key);
    if (found == entries_.end()) return std::nullopt;
    setTime = touch(found->second);
    version = found->second.version;
  }
  if (setTime) setFileTime(kind, key);
  return version;
}

bool PlanStore::contains(const std::string& kind, const std::string& key) {
  return version(kind, key).has_value();
}

std::optional<uint64_t> PlanStore::put(const std::string& kind, const std::string& key,
                                       const std::string& bytes) {
  AUTOSTAGE_CHECK_AS(FormatError, isHexKey(key), "'", key, "' is not a store key (hex digits)");
  const std::string id = kind + "/" + key;
  std::lock_guard<std::mutex> writing(writeMutex_);
  if (!directory_.empty()) {
    try {  // Note [Store locking]: readers go on meanwhile
      core::writeFileAtomically(pathOf(kind, key), bytes, "store entry");
    } catch (const Error& e) {  // a store that cannot write still answers what it has
      core::logger("Service")->warn("store entry {} not written: {}", id, e.what());
      std::unique_lock<std::shared_mutex> lock(mutex_);
      erase(id);
      return std::nullopt;
    }
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  const uint64_t version = ++nextVersion_;
  record(id, static_cast<int64_t>(bytes.size()), version);
  if (directory_.empty()) memory_[id] = bytes;
  if (maxBytes_ > 0 && totalBytes_ > maxBytes_) evictLocked(id);
  return version;
}

void PlanStore::evictLocked(const std::string& keep) {
  const int64_t before = totalBytes_, target = maxBytes_ / 10 * 9;
  std::vector<std::pair<uint64_t, std::string>> byUse;
  for (const auto& [id, entry] : entries_)
    if (id != keep) byUse.emplace_back(entry.lastUse.load(), id);
  std::sort(byUse.begin(), byUse.end());
  int64_t removed = 0;
  for (const auto& [lastUse, id] : byUse) {
    if (totalBytes_ <= target) break;
    if (!directory_.empty()) {
      std::error_code error;
      std::filesystem::remove(pathOf(id), error);
      if (error) {  // still there: still counted, and still served
        core::logger("Service")->warn("store entry {} not evicted: {}", id, error.message());
        continue;
      }
    }
    erase(id);
    ++removed;
  }
  evictions_ += removed;
  core::logger("Service")->info(
      "store above its limit of {} ({}): evicted {} least recently used entr{} ({}); now {} in "
      "{} entr{}",
      sizeText(maxBytes_), sizeText(before), removed, removed == 1 ? "y" : "ies",
      sizeText(before - totalBytes_), sizeText(totalBytes_), entries_.size(),
      entries_.size() == 1 ? "y" : "ies");
}

int64_t PlanStore::entries() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return static_cast<int64_t>(entries_.size());
}

int64_t PlanStore::bytes() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return totalBytes_;
}

int64_t PlanStore::evictions() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return evictions_;
}

}  // namespace autostage::service
