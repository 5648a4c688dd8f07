// Replays every committed corpus input (seeds and inputs that once crashed a loader) through the
// fuzzed loaders in the normal build: a crash, sanitizer report, InternalError, foreign exception
// or broken round trip fails the test. See tests/fuzz/fuzz_loaders.h for the contract.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "tests/fuzz/fuzz_loaders.h"

namespace fs = std::filesystem;
using autostage::fuzz::loaderTargets;
using autostage::fuzz::runLoader;

namespace {

std::vector<fs::path> corpusFiles(const std::string& target) {
  std::vector<fs::path> files;
  fs::path dir = fs::path(AUTOSTAGE_SOURCE_DIR) / "tests/fuzz/corpus" / target;
  if (fs::is_directory(dir))
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::string readBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace

TEST_CASE("every fuzz target has seed inputs", "[fuzz]") {
  for (const std::string& target : loaderTargets()) {
    INFO("target " << target);
    std::vector<fs::path> files = corpusFiles(target);
    CHECK(std::count_if(files.begin(), files.end(), [](const fs::path& p) {
            return p.filename().string().rfind("seed-", 0) == 0;
          }) >= 1);
  }
}

TEST_CASE("corpus inputs load or fail with a user-facing error", "[fuzz]") {
  autostage::fuzz::quietLogging();
  for (const std::string& target : loaderTargets())
    for (const fs::path& file : corpusFiles(target)) {
      INFO(target << ": " << file.filename().string());
      CHECK_NOTHROW(runLoader(target, readBytes(file)));
    }
}

TEST_CASE("an unknown fuzz target is refused", "[fuzz]") {
  CHECK_THROWS_AS(runLoader("no_such_target", ""), std::invalid_argument);
}
