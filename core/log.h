#pragma once
// Named loggers, printed as `[Name] [level] message` like RaNNC's partition logs.
//
// One logger per component: Process, Module, Profiler, Decomposer, DPStaging, Runtime, Comm,
// ParamStorage (others are created on first use). Levels come from the config keys `log_level`
// (all loggers) and `log_levels` (`Name=level,...`). In a multi-rank run only rank 0 prints below
// `warn` unless `log_all_ranks` is set; other ranks prefix their lines with `rankN`.

#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

namespace autostage::core {

// The logger for a component, created with the configured level and pattern on first use.
std::shared_ptr<spdlog::logger> logger(const std::string& name);

// Tells logging which rank this process is (call once after MPI is up); re-applies levels.
void setLogRank(int rank, int worldSize);

class Config;

// Applies levels from `config` (default: the global config) to every existing logger.
void applyLogConfig(const Config& config);
void applyLogConfig();

// Parses `trace|debug|info|warn|error|critical|off`; throws ConfigError naming the bad value.
spdlog::level::level_enum parseLogLevel(const std::string& text, const std::string& key);

// Note [Captured log lines]
// While a LogCapture lives, the lines this thread logs (those its loggers' levels let through)
// are also kept, formatted as printed ("[DPStaging] [info] ..."), and with `echo` false they are
// not printed. The planning service returns each request's partition log this way, from threads
// planning other requests at the same time. Captures nest: the innermost one keeps the lines.
class LogCapture {
 public:
  explicit LogCapture(bool echo = true);
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::vector<std::string> lines_;
  bool echo_;
  LogCapture* previous_;
  friend class CapturingSink;
};

}  // namespace autostage::core
