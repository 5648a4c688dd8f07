#include "core/proto/file_format.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "scratch_files.h"

using namespace autostage;
using namespace autostage::core;
namespace fs = std::filesystem;

namespace {
std::string readBytes(const std::string& path) { return testing::readFileBytes(path); }
fs::path scratch(const std::string& name) { return testing::scratchPath("file_format_test", name); }
}  // namespace

TEST_CASE("framed files round-trip payload, kind and version", "[core]") {
  std::string payload("\x00\x01payload\xff", 10);
  std::string path = scratch("ok.bin").string();
  writeFramedFile(path, "graph", 3, payload);
  FramedPayload back = readFramedFile(path, "graph", 3);
  REQUIRE(back.payload == payload);
  REQUIRE(back.kind == "graph");
  REQUIRE(back.formatVersion == 3);
  REQUIRE(readBytes(path) == encodeFramed("graph", 3, payload));
  REQUIRE_FALSE(fs::exists(path + ".tmp-" + std::to_string(::getpid())));
}

TEST_CASE("every kind of bad file gets its own message", "[core]") {
  std::string payload(200, 'p');
  std::string good = encodeFramed("profile", 1, payload);
  auto decode = [](const std::string& bytes) { return decodeFramed(bytes, "profile", 1, "f"); };

  REQUIRE_THROWS_WITH(decode(""), Catch::Contains("empty"));
  REQUIRE_THROWS_WITH(decode("hello world, no protobuf here"), Catch::Contains("not an autostage file"));
  REQUIRE_THROWS_WITH(decodeFramed(good, "deployment", 1, "f"),
                      Catch::Contains("is a profile file, expected a deployment file"));
  REQUIRE_THROWS_WITH(decodeFramed(good, "profile", 2, "f"),
                      Catch::Contains("version 1") && Catch::Contains("reads version 2"));
  // Every truncation is caught, whichever byte it stops at.
  for (size_t cut = 0; cut < good.size(); ++cut)
    REQUIRE_THROWS_AS(decode(good.substr(0, cut)), FormatError);
  // A flipped byte inside the payload is caught by the hash.
  std::string flipped = good;
  flipped[flipped.size() - 5] ^= 0x20;
  REQUIRE_THROWS_WITH(decode(flipped), Catch::Contains("corrupted"));
}

TEST_CASE("a failed write leaves the old file untouched", "[core]") {
  std::string path = scratch("keep.bin").string();
  writeFramedFile(path, "graph", 1, "old");
  REQUIRE_THROWS_AS(writeFramedFile((scratch("no_such_dir") / "x.bin").string(), "graph", 1, "new"),
                    FormatError);
  REQUIRE(readFramedFile(path, "graph", 1).payload == "old");
  REQUIRE_THROWS_WITH(readFramedFile(scratch("missing.bin").string(), "graph", 1),
                      Catch::Contains("cannot open graph file"));
}

TEST_CASE("writes leave no temporary file, also when the rename fails", "[core]") {
  fs::path dir = scratch("atomic_dir");
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string path = (dir / "plan.deployment").string();
  writeFramedFile(path, "deployment", 1, "first");
  writeFramedFile(path, "deployment", 1, "second");
  REQUIRE(readFramedFile(path, "deployment", 1).payload == "second");
  auto names = [&] {
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(dir)) found.push_back(entry.path().filename());
    return found;
  };
  REQUIRE(names() == std::vector<std::string>{"plan.deployment"});
  // A non-empty directory under the target name: the temporary file is written, the rename
  // fails, and the temporary file is removed.
  fs::path blocked = dir / "blocked";
  fs::create_directories(blocked / "inside");
  REQUIRE_THROWS_WITH(writeFramedFile(blocked.string(), "deployment", 1, "x"),
                      Catch::Contains("cannot move") && Catch::Contains(blocked.string()));
  std::vector<std::string> after = names();
  std::sort(after.begin(), after.end());
  REQUIRE(after == std::vector<std::string>{"blocked", "plan.deployment"});
  fs::remove_all(dir);
}
