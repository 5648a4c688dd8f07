#pragma once
// The one table of options and the effective configuration.
//
// Sources, later wins: defaults in the table < `$AUTOSTAGE_CONF_DIR/config.toml` (default
// `~/.autostage/config.toml`) < environment `RANNC_<KEY>` (keys shared with RaNNC) <
// `AUTOSTAGE_<KEY>` (upper case) < explicit set()
// (e.g. keyword options of autostage.Module). Unknown keys in the file or environment warn; a
// value of the wrong type is a ConfigError naming the key, the value and the expected type.

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace autostage::core {

enum class OptionType { Bool, Int, Float, String };
std::string optionTypeName(OptionType type);  // "bool", "int", "float", "string"

struct OptionSpec {
  std::string key;
  OptionType type;
  std::string defaultValue;  // in the text form accepted by Config::set
  std::string doc;           // one line, shown by show_config and in docs/options.md
  bool planInput = false;    // Note [Plan inputs]
};

// Note [Plan inputs]
// An option is a plan input when a plan made under one value may be wrong under another: the
// planner's own options, the profiler's (they change the measured figures the planner reads),
// the communication costs and how they are measured, the precision. A kept plan is reused only
// for the same values of all of them: a job's plan call carries the planner options, and its
// profile key every other plan input (driver/auto_planner.h planProfileKey derives it from this
// list, so an option added to the table with planInput set is in the key without another edit).
// Options resolved into the job instead (device, memory: Note [Resolving the job] in
// driver/job.h) enter the key as the resolved values.
std::vector<std::string> planInputOptions();

// Every option autostage knows, in display order.
const std::vector<OptionSpec>& optionTable();
// The options table of docs/options.md (Markdown), generated from optionTable().
std::string optionTableMarkdown();

using OptionValue = std::variant<bool, int64_t, double, std::string>;

class Config {
 public:
  Config();  // all defaults

  // Loads defaults, then the TOML file (if present), then the environment.
  static Config load();
  // Applies a TOML document; `origin` names it in messages. Throws ConfigError on bad syntax.
  void applyToml(const std::string& text, const std::string& origin);
  // Applies AUTOSTAGE_<KEY> variables from `environment` (name -> value); other AUTOSTAGE_*
  // names warn (AUTOSTAGE_CONF_DIR excepted). RANNC_<KEY> variables of the options RaNNC and
  // autostage share are applied first (Note [RaNNC environment variables]), so AUTOSTAGE_<KEY>
  // wins; RANNC_CHECKPOINTING sets recompute (always/never); other RANNC_* names warn.
  void applyEnvironment(const std::map<std::string, std::string>& environment);

  // Sets from text (TOML-like: true/false, integers, floats, strings). Throws ConfigError for an
  // unknown key or a value that does not parse as the option's type.
  void set(const std::string& key, const std::string& text, const std::string& origin = "set");
  void setValue(const std::string& key, const OptionValue& value, const std::string& origin = "set");

  bool getBool(const std::string& key) const;
  int64_t getInt(const std::string& key) const;
  double getFloat(const std::string& key) const;
  std::string getString(const std::string& key) const;
  // The value of any option in TOML form (`true`, `4`, `0.5`, `"gpipe"`); ConfigError if unknown.
  std::string text(const std::string& key) const;
  // Where the current value came from: "default", a file path, "env AUTOSTAGE_X", "set".
  std::string origin(const std::string& key) const;

  // Warnings collected while loading (unknown keys); also logged to the Process logger.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // One line per option: `key = value  (origin)`; what show_config prints.
  std::string toString() const;

 private:
  struct Entry {
    OptionValue value;
    std::string origin;
  };
  const Entry& entry(const std::string& key, OptionType type) const;
  void applyRanncEnvironment(const std::map<std::string, std::string>& environment);
  void warn(const std::string& message);

  std::map<std::string, Entry> entries_;
  std::vector<std::string> warnings_;
};

// Process-wide configuration, loaded on first use with Config::load().
Config& globalConfig();

}  // namespace autostage::core
