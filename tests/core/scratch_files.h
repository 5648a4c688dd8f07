#pragma once
// Scratch files for the tests that write files: a per-test, per-process directory under the
// system temporary directory, removed when the process that made it exits, and whole-file reads.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "core/file_system.h"

namespace autostage::testing {

// The directories this process made; removed at its normal exit. A forked child exits through
// the same destructors: the pid check keeps it from removing its parent's files. On POSIX calls
// (core::removeAll): std::filesystem::remove_all segfaults in a program linked with a LibTorch
// wheel (Note [No std::filesystem next to LibTorch wheels] in core/file_system.h).
class ScratchDirectories {
 public:
  ScratchDirectories() = default;
  ScratchDirectories(const ScratchDirectories&) = delete;
  ScratchDirectories& operator=(const ScratchDirectories&) = delete;
  ~ScratchDirectories() {
    if (::getpid() != owner_) return;
    for (const std::filesystem::path& dir : dirs_) {
      try {
        core::removeAll(dir.string());
      } catch (...) {  // best effort: a test's failure stays the one reported
      }
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
  core::createDirectories(dir.string());
  scratchDirectories().add(dir);
  return dir / name;
}

inline std::string readFileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace autostage::testing
