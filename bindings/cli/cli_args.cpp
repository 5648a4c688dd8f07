#include "bindings/cli/cli_args.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/cluster_spec.h"
#include "core/error.h"

namespace autostage::cli {

Arguments::Arguments(const std::vector<std::string>& args, const std::vector<std::string>& valued,
                     const std::vector<std::string>& flags) {
  auto contains = [](const std::vector<std::string>& list, const std::string& key) {
    return std::find(list.begin(), list.end(), key) != list.end();
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    AUTOSTAGE_CHECK_AS(ConfigError, a.rfind("--", 0) == 0, "unexpected argument '", a,
                       "'; options start with --");
    std::string key = a.substr(2), value;
    size_t eq = key.find('=');
    if (eq != std::string::npos) value = key.substr(eq + 1), key = key.substr(0, eq);
    if (contains(flags, key)) {
      values_[key] = "1";
    } else if (contains(valued, key)) {
      if (eq == std::string::npos) {
        AUTOSTAGE_CHECK_AS(ConfigError, i + 1 < args.size(), "option --", key, " needs a value");
        value = args[++i];
      }
      values_[key] = value;
    } else {
      std::string known;
      for (const auto& k : valued) known += " --" + k;
      for (const auto& k : flags) known += " --" + k;
      throw ConfigError("unknown option --" + key + "; known:" + known);
    }
  }
}

std::string Arguments::get(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

int64_t Arguments::getInt(const std::string& key, int64_t fallback) const {
  if (!has(key)) return fallback;
  const std::string text = get(key);
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  AUTOSTAGE_CHECK_AS(ConfigError, !text.empty() && *end == 0, "option --", key, " expects an integer, got '", text, "'");
  return v;
}

double Arguments::getFloat(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  const std::string text = get(key);
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  AUTOSTAGE_CHECK_AS(ConfigError, !text.empty() && *end == 0, "option --", key, " expects a number, got '", text, "'");
  return v;
}

int64_t parseMemorySize(const std::string& text, const std::string& what) {
  return core::parseByteSize(text, what);
}

}  // namespace autostage::cli
