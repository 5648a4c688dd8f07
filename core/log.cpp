#include "core/log.h"

#include <map>
#include <mutex>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/config.h"
#include "core/error.h"

namespace autostage::core {

namespace {
thread_local LogCapture* currentCapture = nullptr;
}  // namespace

// Note [Captured log lines]: every logger prints through this sink, which keeps the line in the
// thread's LogCapture and prints it unless the capture said not to.
class CapturingSink : public spdlog::sinks::sink {
 public:
  CapturingSink() : stderr_(std::make_shared<spdlog::sinks::stderr_color_sink_mt>()) {}
  void log(const spdlog::details::log_msg& msg) override {
    LogCapture* capture = currentCapture;
    if (capture) {
      capture->lines_.push_back("[" + std::string(msg.logger_name.data(), msg.logger_name.size()) +
                                "] [" + spdlog::level::to_string_view(msg.level).data() + "] " +
                                std::string(msg.payload.data(), msg.payload.size()));
      if (!capture->echo_) return;
    }
    stderr_->log(msg);
  }
  void flush() override { stderr_->flush(); }
  void set_pattern(const std::string& pattern) override { stderr_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    stderr_->set_formatter(std::move(formatter));
  }

 private:
  std::shared_ptr<spdlog::sinks::stderr_color_sink_mt> stderr_;
};

LogCapture::LogCapture(bool echo) : echo_(echo), previous_(currentCapture) { currentCapture = this; }
LogCapture::~LogCapture() { currentCapture = previous_; }

namespace {

std::shared_ptr<spdlog::logger> makeLogger(const std::string& name) {
  static auto sink = std::make_shared<CapturingSink>();
  auto log = std::make_shared<spdlog::logger>(name, sink);
  spdlog::register_logger(log);
  return log;
}

// Levels are cached here, not read from the config on every logger() call: loading the config
// itself logs warnings, and must not recurse into loading the config.
struct LogState {
  std::mutex mutex;
  spdlog::level::level_enum defaultLevel = spdlog::level::info;
  std::map<std::string, spdlog::level::level_enum> perLogger;
  int rank = 0;
  int worldSize = 1;
  bool allRanks = false;
};

LogState& state() {
  static LogState s;
  return s;
}

const char* kComponents[] = {"Process", "Module", "Profiler", "Decomposer", "DPStaging",
                             "Runtime", "Comm", "ParamStorage"};

// Caller holds state().mutex.
void configure(spdlog::logger& log) {
  LogState& s = state();
  auto it = s.perLogger.find(log.name());
  auto level = it != s.perLogger.end() ? it->second : s.defaultLevel;
  // Non-zero ranks print warnings and errors only, unless asked otherwise.
  if (s.rank != 0 && !s.allRanks && level < spdlog::level::warn) level = spdlog::level::warn;
  log.set_level(level);
  std::string prefix = s.worldSize > 1 && s.rank != 0 ? "[rank" + std::to_string(s.rank) + "] " : "";
  log.set_pattern(prefix + "[%n] [%l] %v");
}

}  // namespace

spdlog::level::level_enum parseLogLevel(const std::string& text, const std::string& key) {
  auto level = spdlog::level::from_str(text);
  if (level == spdlog::level::off && text != "off")
    throw ConfigError("option '" + key + "': '" + text +
                      "' is not a log level; use trace, debug, info, warn, error, critical or off");
  return level;
}

std::shared_ptr<spdlog::logger> logger(const std::string& name) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (auto existing = spdlog::get(name)) return existing;
  auto log = makeLogger(name);
  configure(*log);
  return log;
}

void applyLogConfig() { applyLogConfig(globalConfig()); }

void applyLogConfig(const Config& config) {
  auto level = parseLogLevel(config.getString("log_level"), "log_level");
  std::map<std::string, spdlog::level::level_enum> perLogger;
  std::string spec = config.getString("log_levels");
  size_t start = 0;
  while (start < spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(start, end - start);
    size_t eq = item.find('=');
    if (!item.empty()) {
      AUTOSTAGE_CHECK_AS(ConfigError, eq != std::string::npos, "option 'log_levels': item '",
                         item, "' must look like Name=level, e.g. Profiler=debug");
      perLogger[item.substr(0, eq)] = parseLogLevel(item.substr(eq + 1), "log_levels");
    }
    start = end + 1;
  }
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.defaultLevel = level;
  s.perLogger = std::move(perLogger);
  s.allRanks = config.getBool("log_all_ranks");
  for (const char* name : kComponents)
    if (!spdlog::get(name)) makeLogger(name);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& log) { configure(*log); });
}

void setLogRank(int rank, int worldSize) {
  {
    LogState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.rank = rank;
    s.worldSize = worldSize;
  }
  applyLogConfig();
}

}  // namespace autostage::core
