#include "core/cluster_spec.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/proto/cluster_file.h"
#include "core/proto/file_format.h"
#include "tests/core/scratch_files.h"

using namespace autostage;
using namespace autostage::core;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return testing::scratchPath("cluster_spec_test", name); }

void writeText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

const char* kGoodToml = R"(# an A100 cluster
device_kind = "a100-40g"
devices = 32
devices_per_node = 8
memory_per_device = "40GiB"
intra_node_bandwidth = 300e9
inter_node_bandwidth = 25e9
latency = 5e-6
peak_flops = 312e12
)";

ClusterSpec goodSpec() {
  ClusterSpec s;
  s.deviceKind = "a100-40g";
  s.devices = 32;
  s.devicesPerNode = 8;
  s.memoryPerDevice = int64_t{40} << 30;
  s.intraNodeBandwidth = 300e9;
  s.interNodeBandwidth = 25e9;
  s.latencySeconds = 5e-6;
  s.peakFlops = 312e12;
  return s;
}

// The good document with one line replaced (or removed when `line` is empty).
std::string withLine(const std::string& key, const std::string& line) {
  std::string text = kGoodToml;
  size_t start = text.find("\n" + key + " = ") + 1;
  size_t end = text.find('\n', start);
  return text.substr(0, start) + line + text.substr(end);
}

std::string configErrorOf(const std::string& toml) {
  try {
    ClusterSpec::fromToml(toml, "c.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

}  // namespace

TEST_CASE("a cluster spec reads from the documented TOML form", "[core][cluster]") {
  ClusterSpec s = ClusterSpec::fromToml(kGoodToml, "c.toml");
  REQUIRE(s == goodSpec());
  REQUIRE(s.memoryPerDevice == 42949672960);
  REQUIRE(s.nodes() == 4);
  // Integer byte counts and integer bandwidths are accepted too; missing keys keep defaults.
  ClusterSpec t = ClusterSpec::fromToml(
      "devices = 3\ndevices_per_node = 2\n"
      "memory_per_device = 17179869184\n"
      "intra_node_bandwidth = 100\n",
      "t.toml");
  REQUIRE(t.memoryPerDevice == 17179869184);
  REQUIRE(t.intraNodeBandwidth == 100.0);
  REQUIRE(t.nodes() == 2);
  REQUIRE(t.deviceKind == ClusterSpec{}.deviceKind);
  REQUIRE(t.latencySeconds == ClusterSpec{}.latencySeconds);
  REQUIRE(t.peakFlops == ClusterSpec{}.peakFlops);
  REQUIRE_THAT(s.toString(), Catch::Contains("a100-40g") && Catch::Contains("devices=32") &&
                                 Catch::Contains("4 nodes x 8") && Catch::Contains("40.00 GiB"));
}

TEST_CASE("each invalid cluster spec field is a ConfigError naming it and its value",
          "[core][cluster]") {
  struct Case {
    std::string key, line, expected;
  };
  std::vector<Case> cases = {
      {"devices", "devices = 0", "devices must be at least 1, got 0"},
      {"devices_per_node", "devices_per_node = 33",
       "devices_per_node must be in 1..devices (1..32), got 33"},
      {"devices_per_node", "devices_per_node = 0",
       "devices_per_node must be in 1..devices (1..32), got 0"},
      {"memory_per_device", "memory_per_device = 0", "memory_per_device must be positive"},
      {"memory_per_device", "", "memory_per_device must be positive"},
      {"intra_node_bandwidth", "intra_node_bandwidth = -1.0",
       "intra_node_bandwidth must be a positive number of bytes/s, got -1"},
      {"inter_node_bandwidth", "inter_node_bandwidth = 0",
       "inter_node_bandwidth must be a positive number of bytes/s, got 0"},
      {"inter_node_bandwidth", "inter_node_bandwidth = nan",
       "inter_node_bandwidth must be a positive"},
      {"latency", "latency = -1e-6",
       "latency must be a non-negative number of seconds, got -1e-06"},
      {"peak_flops", "peak_flops = 0.0", "peak_flops must be a positive number of FLOP/s, got 0"},
      {"device_kind", "device_kind = \"\"", "device_kind must not be empty"},
  };
  for (const Case& c : cases) {
    INFO(c.line);
    std::string message = configErrorOf(withLine(c.key, c.line));
    REQUIRE_THAT(message,
                 Catch::StartsWith("c.toml: cluster spec: ") && Catch::Contains(c.expected));
  }
  REQUIRE_THROWS_AS(ClusterSpec{}.validate(), ConfigError);  // default memory is 0
  REQUIRE_NOTHROW(goodSpec().validate());
}

TEST_CASE("wrong TOML types and unknown keys are ConfigErrors saying what was expected",
          "[core][cluster]") {
  REQUIRE_THAT(configErrorOf(withLine("devices", "devices = \"8\"")),
               Catch::Contains("key 'devices' has value \"8\" but must be an integer"));
  REQUIRE_THAT(configErrorOf(withLine("devices", "devices = 8.0")),
               Catch::Contains("key 'devices'") && Catch::Contains("must be an integer"));
  REQUIRE_THAT(configErrorOf(withLine("devices", "devices = 8589934592")),
               Catch::Contains("fits in 32 bits"));
  REQUIRE_THAT(configErrorOf(withLine("device_kind", "device_kind = 100")),
               Catch::Contains("key 'device_kind' has value 100 but must be a string"));
  REQUIRE_THAT(configErrorOf(withLine("latency", "latency = \"5us\"")),
               Catch::Contains("key 'latency'") && Catch::Contains("must be a number"));
  REQUIRE_THAT(configErrorOf(withLine("memory_per_device", "memory_per_device = 4.0e10")),
               Catch::Contains("key 'memory_per_device'") &&
                   Catch::Contains("must be an integer byte count or a size string"));
  REQUIRE_THAT(configErrorOf(withLine("memory_per_device", "memory_per_device = \"40 GB!\"")),
               Catch::Contains("'memory_per_device' in c.toml") && Catch::Contains("'40 GB!'"));
  REQUIRE_THAT(configErrorOf(std::string(kGoodToml) + "gpus = 4\nnode_count = 2\n"),
               Catch::Contains("unknown key(s) gpus, node_count") &&
                   Catch::Contains("known keys: device_kind, devices, devices_per_node, "
                                   "memory_per_device, intra_node_bandwidth, inter_node_bandwidth, "
                                   "latency, peak_flops"));
  REQUIRE_THAT(configErrorOf(std::string(kGoodToml) + "[net]\nspeed = 1\n"),
               Catch::Contains("unknown key(s) net"));
  REQUIRE_THAT(configErrorOf("devices = = 3\n"), Catch::Contains("c.toml is not valid TOML"));
}

TEST_CASE("byte sizes parse with binary and decimal units", "[core][cluster]") {
  struct Case {
    const char* text;
    int64_t bytes;
  };
  const Case good[] = {
      {"40GiB", 42949672960},
      {"40 GiB", 42949672960},
      {"512MiB", 536870912},
      {"1.5GB", 1500000000},
      {"123456", 123456},
      {"0", 0},
      {"7B", 7},
      {"2KiB", 2048},
      {"2KB", 2000},
      {"3MB", 3000000},
      {"1TiB", 1099511627776},
      {"2TB", 2000000000000},
      {"0.5KiB", 512},
      {"1.5 GiB", 1610612736},
      {"  8 MiB  ", 8388608},
      {"40gib", 42949672960},
      {"9007199254740993", 9007199254740993},
  };
  for (const Case& c : good) {
    INFO(c.text);
    REQUIRE(parseByteSize(c.text, "size") == c.bytes);
  }
  const char* bad[] = {
      "",        "GiB",  "40XB",           "40 GiBs",
      "-1GiB",   "1e9",  "1.2.3GB",        ".",
      "40 G iB", "nine", "10000000000TiB", "99999999999999999999999999999999999999"};
  for (const char* text : bad) {
    INFO(text);
    REQUIRE_THROWS_AS(parseByteSize(text, "size"), ConfigError);
  }
  REQUIRE_THROWS_WITH(parseByteSize("40XB", "memory_per_device in a.toml"),
                      Catch::StartsWith("memory_per_device in a.toml: cannot read '40XB'") &&
                          Catch::Contains("unknown unit 'XB'"));
}

TEST_CASE("formatBytes renders bytes with binary units", "[core][cluster]") {
  REQUIRE(formatBytes(0) == "0 B");
  REQUIRE(formatBytes(512) == "512 B");
  REQUIRE(formatBytes(1023) == "1023 B");
  REQUIRE(formatBytes(1024) == "1.00 KiB");
  REQUIRE(formatBytes(1536) == "1.50 KiB");
  REQUIRE(formatBytes(1.5 * (1 << 30)) == "1.50 GiB");
  REQUIRE(formatBytes(40.0 * (int64_t{1} << 30)) == "40.00 GiB");
  REQUIRE(formatBytes(double(int64_t{3} << 40)) == "3.00 TiB");
  REQUIRE(formatBytes(double(int64_t{1} << 50)) == "1.00 PiB");
  REQUIRE(formatBytes(-2048) == "-2.00 KiB");
}

TEST_CASE("cluster files: Protobuf and TOML both load, chosen by content",
          "[core][cluster][proto]") {
  ClusterSpec spec = goodSpec();
  std::string pbPath = scratch("c.cluster").string();
  std::string tomlPath = scratch("c.toml").string();
  saveClusterSpec(spec, pbPath);
  writeText(tomlPath, kGoodToml);
  REQUIRE(loadClusterSpec(pbPath) == spec);
  REQUIRE(loadClusterSpec(tomlPath) == spec);
  REQUIRE(decodeClusterSpec(encodeClusterSpec(spec)) == spec);
  REQUIRE(encodeClusterSpec(spec) == encodeClusterSpec(loadClusterSpec(pbPath)));

  ClusterSpec bad = spec;
  bad.devicesPerNode = 64;
  std::string badPath = scratch("bad.cluster").string();
  REQUIRE_THROWS_WITH(saveClusterSpec(bad, badPath), Catch::Contains("devices_per_node"));
  REQUIRE_FALSE(fs::exists(badPath));
  // A well-formed file holding an invalid spec is refused when loaded.
  writeText(badPath, encodeFramed(kClusterFileKind, kClusterFormatVersion,
                                  toProto(bad).SerializeAsString()));
  REQUIRE_THROWS_WITH(loadClusterSpec(badPath),
                      Catch::StartsWith("'" + badPath + "': cluster spec: devices_per_node"));
  REQUIRE_THROWS_AS(loadClusterSpec(badPath), ConfigError);
  REQUIRE_THROWS_WITH(loadClusterSpec(scratch("none.toml").string()),
                      Catch::Contains("cannot open cluster spec file"));
}

TEST_CASE("truncated, corrupted and foreign cluster files are FormatErrors",
          "[core][cluster][proto]") {
  std::string good = encodeClusterSpec(goodSpec());
  for (size_t cut = 0; cut < good.size(); ++cut)
    REQUIRE_THROWS_AS(decodeClusterSpec(good.substr(0, cut)), FormatError);
  // Through the content-sniffing loader: every cut that keeps the header is a FormatError.
  std::string path = scratch("cut.cluster").string();
  for (size_t cut = 11; cut < good.size(); ++cut) {
    writeText(path, good.substr(0, cut));
    REQUIRE_THROWS_AS(loadClusterSpec(path), FormatError);
  }
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x04;
  writeText(path, flipped);
  REQUIRE_THROWS_WITH(loadClusterSpec(path), Catch::Contains("corrupted"));
  writeText(path, encodeFramed("deployment", 1, "x"));
  REQUIRE_THROWS_WITH(loadClusterSpec(path),
                      Catch::Contains("is a deployment file, expected a cluster file"));
  writeText(path, encodeFramed("cluster", 2, toProto(goodSpec()).SerializeAsString()));
  REQUIRE_THROWS_WITH(loadClusterSpec(path), Catch::Contains("cluster format version 2"));
}
