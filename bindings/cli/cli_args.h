#pragma once
// Argument parsing for `autostage plan` (no library dependency beyond std).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace autostage::cli {

// `--key value` and `--flag` arguments. Throws ConfigError on an unknown option or missing value.
class Arguments {
 public:
  // `valued` lists options taking a value, `flags` options without one (both without `--`).
  Arguments(const std::vector<std::string>& args, const std::vector<std::string>& valued,
            const std::vector<std::string>& flags);
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  std::string get(const std::string& key, const std::string& fallback = "") const;
  int64_t getInt(const std::string& key, int64_t fallback) const;
  double getFloat(const std::string& key, double fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

// "40GiB", "512MiB", "1.5GB", "123456" -> bytes. Throws ConfigError naming `what`.
int64_t parseMemorySize(const std::string& text, const std::string& what);

}  // namespace autostage::cli
