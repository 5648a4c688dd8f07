#pragma once
// Scratch files for the tests that write files: a per-test, per-process directory under the
// system temporary directory, removed when the process that made it exits, and whole-file reads.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

namespace autostage::testing {

// The directories this process made; removed at its normal exit. A forked child exits through
// the same destructors: the pid check keeps it from removing its parent's files.
class ScratchDirectories {
 public:
  ScratchDirectories() = default;
  ScratchDirectories(const ScratchDirectories&) = delete;
  ScratchDirectories& operator=(const ScratchDirectories&) = delete;
  ~ScratchDirectories() {
    if (::getpid() != owner_) return;
    for (const std::filesystem::path& dir : dirs_) {
      std::error_code ignored;  // best effort: a test's failure stays the one reported
      std::filesystem::remove_all(dir, ignored);
    }
  }
  void add(const std::filesystem::path& dir) { dirs_.insert(dir); }

 private:
  const pid_t owner_ = ::getpid();
  std::set<std::filesystem::path> dirs_;
};

inline ScratchDirectories& scratchDirectories() {
  static ScratchDirectories dirs;
  return dirs;
}

// `<tmp>/autostage_<test>_<pid>/<name>`, creating the directory.
inline std::filesystem::path scratchPath(const std::string& test, const std::string& name) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("autostage_" + test + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  scratchDirectories().add(dir);
  return dir / name;
}

inline std::string readFileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace autostage::testing
