#pragma once
// Scratch files for the file-format tests: a per-test, per-process directory under the system
// temporary directory, and whole-file reads.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace autostage::testing {

// `<tmp>/autostage_<test>_<pid>/<name>`, creating the directory.
inline std::filesystem::path scratchPath(const std::string& test, const std::string& name) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("autostage_" + test + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

inline std::string readFileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace autostage::testing
