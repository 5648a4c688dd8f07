#include "profiler/profiler_options.h"

#include <cstdlib>
#include <set>
#include <sstream>

#include "core/config.h"
#include "core/error.h"

namespace autostage::profiler {

std::vector<int64_t> parseBatchSizes(const std::string& text, const std::string& origin) {
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    AUTOSTAGE_CHECK_AS(ConfigError, b != std::string::npos, origin, ": empty entry in batch sizes '",
                       text, "'; expected comma-separated positive integers like '4,8'");
    std::string word = item.substr(b, e - b + 1);
    char* end = nullptr;
    long long value = std::strtoll(word.c_str(), &end, 10);
    AUTOSTAGE_CHECK_AS(ConfigError, *end == '\0' && value > 0, origin, ": batch size '", word,
                       "' in '", text, "' is not a positive integer; use e.g. '4,8'");
    sizes.push_back(value);
  }
  return sizes;
}

void ProfilerOptions::validate() const {
  std::set<int64_t> distinct;
  for (int64_t b : batchSizes) {
    AUTOSTAGE_CHECK_AS(ConfigError, b > 0, "profiler batch sizes must be positive, got ", b);
    AUTOSTAGE_CHECK_AS(ConfigError, distinct.insert(b).second, "profiler batch size ", b,
                       " is listed twice; list each size once");
  }
  AUTOSTAGE_CHECK_AS(ConfigError, warmupRuns >= 1, "profiler warmupRuns must be >= 1, got ",
                     warmupRuns);
  AUTOSTAGE_CHECK_AS(ConfigError, repeats >= 3, "profile_repeats must be >= 3 (each pass keeps the ",
                     "median of at least 3 timed runs), got ", repeats);
  AUTOSTAGE_CHECK_AS(ConfigError, passes >= 1 && passes <= kMaxPasses, "profile_passes must be in 1..",
                     kMaxPasses, ", got ", passes);
  AUTOSTAGE_CHECK_AS(ConfigError, passSeconds >= 0, "profile_pass_seconds must be >= 0, got ",
                     passSeconds);
  AUTOSTAGE_CHECK_AS(ConfigError, calibrationBlocks >= 0,
                     "profile_calibration_blocks must be >= 0, got ", calibrationBlocks);
  AUTOSTAGE_CHECK_AS(ConfigError, calibrationRepeats >= 3,
                     "profiler calibrationRepeats must be >= 3, got ", calibrationRepeats);
  AUTOSTAGE_CHECK_AS(ConfigError, calibrationMinSeconds >= 0,
                     "profiler calibrationMinSeconds must be >= 0, got ", calibrationMinSeconds);
  AUTOSTAGE_CHECK_AS(ConfigError, optParamFactor >= 0, "opt_param_factor must be >= 0, got ",
                     optParamFactor);
  for (size_t i = 0; i < splitDegrees.size(); ++i) {
    const int t = splitDegrees[i];
    AUTOSTAGE_CHECK_AS(ConfigError, t == 2 || t == 4 || t == 8,
                       "profiler splitDegrees holds ", t,
                       "; tensor-parallel degrees are 2, 4 or 8");
    AUTOSTAGE_CHECK_AS(ConfigError, i == 0 || splitDegrees[i - 1] < t,
                       "profiler splitDegrees must ascend without repeats; ", splitDegrees[i - 1],
                       " is followed by ", t);
  }
}

std::string ProfilerOptions::toString() const {
  std::ostringstream out;
  out << "batch_sizes=[";
  for (size_t i = 0; i < batchSizes.size(); ++i) out << (i ? "," : "") << batchSizes[i];
  out << (batchSizes.empty() ? "auto" : "") << "] " << measurementText() << " cache="
      << (cacheFile.empty() ? (cacheDir.empty() ? "none" : cacheDir) : cacheFile);
  return out.str();
}

std::string ProfilerOptions::measurementText() const {
  std::ostringstream out;
  out << "warmup=" << warmupRuns << " repeats=" << repeats << " passes=" << passes
      << " pass_seconds=" << passSeconds << " calibration_blocks=" << calibrationBlocks
      << " calibration_repeats=" << calibrationRepeats << " seed=" << seed
      << " normalize_load=" << normalizeLoad << " reuse_identical=" << reuseIdenticalGroups
      << " opt_param_factor=" << optParamFactor << " precision=" << core::precisionName(precision);
  if (!splitDegrees.empty()) {  // Note [Tensor-parallel profile]: keys without it stay as they were
    out << " split_degrees=";
    for (size_t i = 0; i < splitDegrees.size(); ++i) out << (i ? "," : "") << splitDegrees[i];
  }
  return out.str();
}

ProfilerOptions ProfilerOptions::fromConfig() {
  const core::Config& config = core::globalConfig();
  ProfilerOptions options;
  options.cacheDir = config.getString("profile_cache_dir");
  options.batchSizes = parseBatchSizes(config.getString("profile_batch_sizes"),
                                       "option profile_batch_sizes");
  options.repeats = static_cast<int>(config.getInt("profile_repeats"));
  options.passes = static_cast<int>(config.getInt("profile_passes"));
  options.passSeconds = config.getFloat("profile_pass_seconds");
  options.calibrationBlocks = static_cast<int>(config.getInt("profile_calibration_blocks"));
  options.optParamFactor = config.getFloat("opt_param_factor");
  options.precision = core::parsePrecision(config.getString("precision"));
  options.validate();
  return options;
}

}  // namespace autostage::profiler
