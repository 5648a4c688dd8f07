#include "core/proto/file_format.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <fstream>

#include "core/error.h"

using namespace autostage;
using namespace autostage::core;
namespace fs = std::filesystem;

namespace {
std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / "autostage_file_format_test";
  fs::create_directories(dir);
  return dir / name;
}
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
