#include "core/cluster_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <toml.hpp>
#include <vector>

#include "core/error.h"

namespace autostage::core {
namespace {

const std::vector<std::string>& knownKeys() {
  static const std::vector<std::string> keys = {"device_kind",
                                                "devices",
                                                "devices_per_node",
                                                "memory_per_device",
                                                "intra_node_bandwidth",
                                                "inter_node_bandwidth",
                                                "latency",
                                                "peak_flops"};
  return keys;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// A quantity that must be strictly positive (and not NaN).
void checkPositive(double value, const char* field, const char* unit) {
  AUTOSTAGE_CHECK_AS(ConfigError, value > 0 && std::isfinite(value), "cluster spec: ", field,
                     " must be a positive ", unit, ", got ", value);
}

struct ByteUnit {
  const char* name;
  int64_t multiplier;
};
constexpr ByteUnit kByteUnits[] = {
    {"", 1},
    {"B", 1},
    {"KB", 1000},
    {"MB", 1000000},
    {"GB", 1000000000},
    {"TB", 1000000000000},
    {"KiB", int64_t(1) << 10},
    {"MiB", int64_t(1) << 20},
    {"GiB", int64_t(1) << 30},
    {"TiB", int64_t(1) << 40},
};

bool equalsIgnoreCase(const std::string& a, const char* b) {
  size_t i = 0;
  for (; i < a.size() && b[i]; ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return i == a.size() && !b[i];
}

// Reads the TOML document's keys into `spec`, checking each key's type.
class TomlReader {
 public:
  TomlReader(const toml::value& doc, const std::string& origin) : doc_(doc), origin_(origin) {}

  void read(ClusterSpec* spec) {
    std::vector<std::string> unknown;
    for (const auto& [key, value] : doc_.as_table()) {
      const auto& known = knownKeys();
      if (std::find(known.begin(), known.end(), key) == known.end()) unknown.push_back(key);
    }
    std::sort(unknown.begin(), unknown.end());  // the TOML table is unordered
    AUTOSTAGE_CHECK_AS(ConfigError, unknown.empty(), "cluster spec ", origin_, ": unknown key(s) ",
                       joined(unknown), "; known keys: ", joined(knownKeys()));
    readString("device_kind", &spec->deviceKind);
    readInt("devices", &spec->devices);
    readInt("devices_per_node", &spec->devicesPerNode);
    readBytes("memory_per_device", &spec->memoryPerDevice);
    readFloat("intra_node_bandwidth", &spec->intraNodeBandwidth);
    readFloat("inter_node_bandwidth", &spec->interNodeBandwidth);
    readFloat("latency", &spec->latencySeconds);
    readFloat("peak_flops", &spec->peakFlops);
  }

 private:
  const toml::value* find(const std::string& key) const {
    const auto& table = doc_.as_table();
    auto it = table.find(key);
    return it == table.end() ? nullptr : &it->second;
  }
  ConfigError wrongType(const std::string& key, const toml::value& value,
                        const char* expected) const {
    return ConfigError("cluster spec " + origin_ + ": key '" + key + "' has value " +
                       toml::format(value) + " but must be " + expected);
  }
  void readString(const std::string& key, std::string* out) const {
    const toml::value* v = find(key);
    if (!v) return;
    if (!v->is_string()) throw wrongType(key, *v, "a string");
    *out = v->as_string().str;
  }
  void readInt(const std::string& key, int* out) const {
    const toml::value* v = find(key);
    if (!v) return;
    if (!v->is_integer()) throw wrongType(key, *v, "an integer");
    auto n = v->as_integer();
    if (n < std::numeric_limits<int>::min() || n > std::numeric_limits<int>::max())
      throw wrongType(key, *v, "an integer that fits in 32 bits");
    *out = static_cast<int>(n);
  }
  void readFloat(const std::string& key, double* out) const {
    const toml::value* v = find(key);
    if (!v) return;
    if (v->is_integer())
      *out = static_cast<double>(v->as_integer());
    else if (v->is_floating())
      *out = v->as_floating();
    else
      throw wrongType(key, *v, "a number");
  }
  void readBytes(const std::string& key, int64_t* out) const {
    const toml::value* v = find(key);
    if (!v) return;
    if (v->is_integer())
      *out = v->as_integer();
    else if (v->is_string())
      *out = parseByteSize(v->as_string().str, "'" + key + "' in " + origin_);
    else
      throw wrongType(key, *v, "an integer byte count or a size string like \"40GiB\"");
  }

  const toml::value& doc_;
  const std::string& origin_;
};

}  // namespace

void ClusterSpec::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError, !deviceKind.empty(),
                     "cluster spec: device_kind must not be empty (e.g. \"cpu\", \"a100-40g\")");
  AUTOSTAGE_CHECK_AS(ConfigError, devices >= 1, "cluster spec: devices must be at least 1, got ",
                     devices);
  AUTOSTAGE_CHECK_AS(ConfigError, devicesPerNode >= 1 && devicesPerNode <= devices,
                     "cluster spec: devices_per_node must be in 1..devices (1..", devices,
                     "), got ", devicesPerNode);
  AUTOSTAGE_CHECK_AS(ConfigError, memoryPerDevice > 0,
                     "cluster spec: memory_per_device must be positive (bytes, or a string like "
                     "\"40GiB\"), got ",
                     memoryPerDevice);
  checkPositive(intraNodeBandwidth, "intra_node_bandwidth", "number of bytes/s");
  checkPositive(interNodeBandwidth, "inter_node_bandwidth", "number of bytes/s");
  AUTOSTAGE_CHECK_AS(ConfigError, latencySeconds >= 0 && std::isfinite(latencySeconds),
                     "cluster spec: latency must be a non-negative number of seconds, got ",
                     latencySeconds);
  checkPositive(peakFlops, "peak_flops", "number of FLOP/s");
}

std::string ClusterSpec::toString() const {
  std::ostringstream out;
  out << "device_kind=" << deviceKind << " devices=" << devices << " (" << nodes() << " nodes x "
      << devicesPerNode << ") memory_per_device=" << formatBytes(double(memoryPerDevice))
      << " intra_node_bandwidth=" << intraNodeBandwidth
      << " B/s inter_node_bandwidth=" << interNodeBandwidth << " B/s latency=" << latencySeconds
      << " s peak_flops=" << peakFlops;
  return out.str();
}

ClusterSpec ClusterSpec::fromToml(const std::string& text, const std::string& origin) {
  std::istringstream in(text);
  toml::value doc;
  try {
    doc = toml::parse(in, origin);
  } catch (const std::exception& e) {
    throw ConfigError("cluster spec " + origin + " is not valid TOML: " + e.what());
  }
  ClusterSpec spec;
  TomlReader(doc, origin).read(&spec);
  try {
    spec.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(origin + ": " + e.what());
  }
  return spec;
}

bool ClusterSpec::operator==(const ClusterSpec& o) const {
  return deviceKind == o.deviceKind && devices == o.devices && devicesPerNode == o.devicesPerNode &&
         memoryPerDevice == o.memoryPerDevice && intraNodeBandwidth == o.intraNodeBandwidth &&
         interNodeBandwidth == o.interNodeBandwidth && latencySeconds == o.latencySeconds &&
         peakFlops == o.peakFlops;
}

// Accepted: digits with an optional fraction, optional spaces, an optional unit (case-insensitive;
// KiB..TiB binary, KB..TB decimal, B or nothing for bytes). No sign, no exponent.
int64_t parseByteSize(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return ConfigError(what + ": cannot read '" + text + "' as a byte size (" + why +
                       "); write e.g. 40GiB, 512MiB, 1.5GB or a plain byte count");
  };
  size_t pos = 0, end = text.size();
  while (pos < end && text[pos] == ' ') ++pos;
  while (end > pos && text[end - 1] == ' ') --end;
  size_t numberStart = pos;
  while (pos < end && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.'))
    ++pos;
  std::string number = text.substr(numberStart, pos - numberStart);
  if (number.empty() || number == "." || number.find('.') != number.rfind('.'))
    throw bad("expected a non-negative number first");
  if (number.size() > 30) throw bad("too large for a 64-bit byte count");
  while (pos < end && text[pos] == ' ') ++pos;
  std::string unit = text.substr(pos, end - pos);
  for (const ByteUnit& u : kByteUnits) {
    if (!equalsIgnoreCase(unit, u.name)) continue;
    // Whole numbers in exact integer arithmetic; fractions rounded to the nearest byte.
    long double bytes = std::stold(number) * static_cast<long double>(u.multiplier);
    if (bytes >= 9.2e18L) throw bad("too large for a 64-bit byte count");
    if (number.find('.') != std::string::npos) return static_cast<int64_t>(std::llroundl(bytes));
    return static_cast<int64_t>(std::stoll(number)) * u.multiplier;
  }
  throw bad("unknown unit '" + unit + "'; known: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB");
}

std::string formatBytes(double bytes) {
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  char buf[64];
  if (std::fabs(bytes) < 1024) {
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
    return buf;
  }
  int unit = 0;
  double scaled = bytes / 1024;
  while (std::fabs(scaled) >= 1024 && unit < 4) scaled /= 1024, ++unit;
  std::snprintf(buf, sizeof buf, "%.2f %s", scaled, units[unit]);
  return buf;
}

}  // namespace autostage::core
