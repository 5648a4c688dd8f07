#include "service/plan_store.h"

#include <filesystem>
#include <fstream>
#include <iterator>

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

}  // namespace

PlanStore::PlanStore(std::string directory) : directory_(std::move(directory)) {
  if (directory_.empty()) return;
  namespace fs = std::filesystem;
  std::error_code error;
  for (const char* kind : kKinds) {
    fs::path dir = fs::path(directory_) / kind;
    fs::create_directories(dir, error);
    AUTOSTAGE_CHECK_AS(ConfigError, !error, "cannot create the store directory ", dir.string(),
                       ": ", error.message(), "; pass --store a directory this user can write");
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (entry.path().extension() != extensionOf(kind) || !entry.is_regular_file()) continue;
      sizes_[std::string(kind) + "/" + entry.path().stem().string()] =
          static_cast<int64_t>(entry.file_size());
    }
  }
}

std::string PlanStore::pathOf(const std::string& kind, const std::string& key) const {
  return directory_ + "/" + kind + "/" + key + extensionOf(kind);
}

std::optional<std::string> PlanStore::get(const std::string& kind, const std::string& key) {
  AUTOSTAGE_CHECK_AS(FormatError, isHexKey(key), "'", key, "' is not a store key (hex digits)");
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string id = kind + "/" + key;
  if (directory_.empty()) {
    auto found = memory_.find(id);
    return found == memory_.end() ? std::nullopt : std::optional<std::string>(found->second);
  }
  if (!sizes_.count(id)) return std::nullopt;
  std::ifstream in(pathOf(kind, key), std::ios::binary);
  if (!in) {
    core::logger("Service")->warn("store entry {} cannot be read: treated as missing", id);
    sizes_.erase(id);
    return std::nullopt;
  }
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void PlanStore::put(const std::string& kind, const std::string& key, const std::string& bytes) {
  AUTOSTAGE_CHECK_AS(FormatError, isHexKey(key), "'", key, "' is not a store key (hex digits)");
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string id = kind + "/" + key;
  sizes_[id] = static_cast<int64_t>(bytes.size());
  if (directory_.empty()) {
    memory_[id] = bytes;
    return;
  }
  try {
    core::writeFileAtomically(pathOf(kind, key), bytes, "store entry");
  } catch (const Error& e) {  // a store that cannot write still answers from memory
    core::logger("Service")->warn("store entry {} not written: {}", id, e.what());
  }
}

int64_t PlanStore::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(sizes_.size());
}

int64_t PlanStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& [id, size] : sizes_) total += size;
  return total;
}

}  // namespace autostage::service
