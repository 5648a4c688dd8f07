#include "core/config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <toml.hpp>

#include "core/error.h"
#include "core/log.h"

namespace autostage::core {

const std::vector<OptionSpec>& optionTable() {
  using T = OptionType;
  constexpr bool kPlanInput = true;  // Note [Plan inputs] in config.h
  static const std::vector<OptionSpec> table = {
      // Logging
      {"log_level", T::String, "info", "level of every logger: trace, debug, info, warn, error, off"},
      {"log_levels", T::String, "", "per-logger levels overriding log_level, e.g. `Profiler=debug,Comm=warn`"},
      {"log_all_ranks", T::Bool, "false", "print info lines on every rank, not only rank 0"},
      // Planning (decomposer)
      {"decomposer", T::String, "dp", "planner: dp, data_parallel, uniform or param_balanced", kPlanInput},
      {"max_blocks", T::Int, "256", "coarsen the graph to at most this many blocks before the stage search", kPlanInput},
      {"partition_num", T::Int, "0", "force this many pipeline stages (0: let the planner choose)", kPlanInput},
      {"pipeline_num", T::Int, "0", "force this many micro-batches (0: let the planner choose)", kPlanInput},
      {"micro_batch_size", T::Int, "0",
       "force every micro-batch to this many rows per replica, the batch splitting exactly into "
       "replicas x micro-batches of it; the planner then tries every micro-batch count from "
       "min_pipeline to max_pipeline that divides the batch / this size "
       "(0: the planner chooses; a model whose batch size torch.export fixed plans with the "
       "captured size)", kPlanInput},
      {"min_pipeline", T::Int, "1", "smallest micro-batch count the planner tries", kPlanInput},
      {"max_pipeline", T::Int, "0",
       "largest micro-batch count the planner tries (powers of two and divisors of the batch; "
       "with micro_batch_size, divisors of batch / that size); 0: up to 32, and up to the batch "
       "where no plan fits within 32", kPlanInput},
      {"schedule", T::String, "auto", "pipeline schedule: gpipe, 1f1b or auto (planner chooses)", kPlanInput},
      {"recompute", T::String, "auto",
       "activation recomputation per stage: auto (planner chooses), always or never", kPlanInput},
      {"zero", T::String, "auto",
       "ZeRO-1 in replicated stages (optimizer state split over a stage's replicas): auto "
       "(planner chooses per stage, when it makes the plan fit or costs nothing), 1 (every "
       "replicated stage) or 0 (never)", kPlanInput},
      {"virtual_stages", T::String, "auto",
       "stages per rank for the interleaved 1f1b schedule: auto (planner chooses 1, 2 or 4), 1 "
       "(no interleaving), 2 or 4", kPlanInput},
      {"tensor_parallel", T::String, "1",
       "tensor-parallel degree per stage (Megatron-style, its ranks on one node): auto (planner "
       "chooses per stage where faster or needed to fit), 1 (none), 2, 4 or 8; the runtime "
       "splits attention, MLP, vocabulary-embedding and LM-head patterns (a head with its loss "
       "in the model)", kPlanInput},
      {"mem_limit_gb", T::Float, "0", "device memory to plan for in GiB (0: the device's own memory)", kPlanInput},
      {"mem_margin", T::Float, "0.1", "fraction of device memory kept free as a safety margin", kPlanInput},
      {"opt_param_factor", T::Float, "2", "optimizer state bytes per parameter byte (2 for Adam, 0 for SGD)", kPlanInput},
      {"gradient_bucket_bytes", T::Int, "26214400",
       "bytes of gradients summed over a stage's replicas in one allreduce; the planner counts one "
       "such bucket (at most the stage's parameter bytes) in a replicated stage's memory", kPlanInput},
      // Profiling
      {"plan_cache_dir", T::String, "",
       "store of the local planner: plans and profiles kept by keys of their content, so a later "
       "launch of the same job skips profiling and planning (empty: kept in memory only)"},
      {"planner_address", T::String, "",
       "planning service (`autostage serve`) rank 0 asks for the plan: unix:PATH, tcp:PORT or "
       "tcp:HOST:PORT; it skips profiling when the service keeps this model's profile, and plans "
       "locally when the service does not answer (empty: plan locally)"},
      {"planner_timeout_s", T::Float, "30",
       "how long rank 0 waits for the planning service before planning locally"},
      {"profile_cache_dir", T::String, "", "directory of cached profiles keyed by the profile key: graph, batch sizes measured, profiler options, device and dtype (empty: no cache)"},
      {"profile_batch_sizes", T::String, "", "comma-separated micro-batch sizes to profile at (empty: a quarter and a half of the example batch)", kPlanInput},
      {"profile_repeats", T::Int, "3", "timed runs per node, batch size and pass; each pass keeps their median (warm-up excluded)", kPlanInput},
      {"profile_passes", T::Int, "3", "passes through the model, each timing every node; a figure is the smallest pass median, so a moment of contention on a shared machine does not skew it", kPlanInput},
      {"profile_pass_seconds", T::Float, "1.5", "least time the timing passes at one batch size span: more passes (at most 16) are added until they do", kPlanInput},
      {"profile_calibration_blocks", T::Int, "4", "real multi-node blocks measured to calibrate the composed cost model", kPlanInput},
      // Communication fallbacks used when only one rank exists to measure with
      {"comm_bandwidth", T::Float, "10e9", "point-to-point bandwidth in bytes/s when it cannot be measured", kPlanInput},
      {"allreduce_bandwidth", T::Float, "10e9", "allreduce bus bandwidth in bytes/s when it cannot be measured", kPlanInput},
      {"comm_latency", T::Float, "20e-6", "per-message latency in seconds when it cannot be measured", kPlanInput},
      {"measure_comm", T::Bool, "true",
       "measure point-to-point and allreduce costs between the ranks before planning (false: "
       "plan with comm_bandwidth, allreduce_bandwidth and comm_latency)", kPlanInput},
      {"comm_timeout_s", T::Float, "60", "seconds a blocking receive or collective waits before failing with the peer named"},
      {"device", T::String, "auto",
       "where the stages run: auto (CUDA when autostage was built with it and a GPU is visible), "
       "cpu or cuda; rank r uses cuda:(local rank mod GPU count)"},
      {"comm_backend", T::String, "auto",
       "how tensors travel between ranks: auto (nccl for a CUDA job with a GPU per rank, else "
       "mpi), nccl or mpi; MPI is always the control plane", kPlanInput},
      // Plan reuse
      {"save_deployment", T::Bool, "false",
       "rank 0 writes the deployment it planned to deployment_file"},
      {"load_deployment", T::Bool, "false",
       "load deployment_file instead of profiling and planning (checked against this job)"},
      {"deployment_file", T::String, "",
       "deployment file for save_deployment, load_deployment and partitioning_dry_run_np"},
      {"partitioning_dry_run_np", T::Int, "0",
       "plan for this many ranks on however many are running, save the plan to "
       "deployment_file and exit (0: off)"},
      // Capture
      {"front_end", T::String, "auto",
       "how a Python model is captured: auto (export where torch.export has the training IR, "
       "PyTorch 2.5+, except for models that run scripted code of their own; else torchscript), "
       "export (torch.export) or torchscript (torch.jit.trace); Note [Front ends]"},
      // Runtime
      {"precision", T::String, "fp32",
       "fp32, or mixed precision with fp32 master weights: bf16 (CPU and CUDA autocast) or fp16 "
       "(CUDA; on the CPU with a build against LibTorch 2.5 or later: CPU autocast in LibTorch "
       "1.13 supports only bf16)", kPlanInput},
      {"allow_replan", T::Bool, "false", "when a later batch changes the traced shape (dims other than 0) or dtype: retrace and replan (true) or raise an error (false)"},
      {"measure_memory", T::Bool, "true",
       "measure every rank's peak memory each step and log it beside the plan's prediction (debug "
       "every step, info once after step 3, a warning above the usable memory)"},
      {"trace_events", T::Bool, "false", "record each rank's forward/backward/send/recv/allreduce times and write a Chrome-trace JSON per rank (see trace_events_dir)"},
      {"trace_events_dir", T::String, "autostage_trace", "directory of the trace_events files (trace_rank0.json, trace_rank1.json, ...), rewritten at the end of every step"},
      {"trace_events_steps", T::Int, "10", "steps kept in each trace_events file (the latest ones)"},
  };
  return table;
}

std::vector<std::string> planInputOptions() {
  std::vector<std::string> keys;
  for (const auto& o : optionTable())
    if (o.planInput) keys.push_back(o.key);
  return keys;
}

std::string optionTypeName(OptionType type) {
  switch (type) {
    case OptionType::Bool: return "bool";
    case OptionType::Int: return "int";
    case OptionType::Float: return "float";
    case OptionType::String: return "string";
  }
  return "string";
}

std::string optionTableMarkdown() {
  std::ostringstream out;
  out << "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& o : optionTable())
    out << "| `" << o.key << "` | " << optionTypeName(o.type) << " | `" << o.defaultValue
        << "` | " << o.doc << " |\n";
  return out.str();
}

namespace {

std::string lowerCase(const std::string& s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string upperCase(const std::string& s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

const OptionSpec* findOption(const std::string& key) {
  for (const auto& o : optionTable())
    if (o.key == key) return &o;
  return nullptr;
}

std::string knownKeys() {
  std::string out;
  for (const auto& o : optionTable()) out += (out.empty() ? "" : ", ") + o.key;
  return out;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

OptionValue parseText(const OptionSpec& spec, const std::string& raw, const std::string& origin) {
  std::string text = trim(raw);
  auto bad = [&]() -> ConfigError {
    return ConfigError("option '" + spec.key + "' from " + origin + ": value '" + raw +
                       "' is not a " + optionTypeName(spec.type) + " (" + spec.doc + ")");
  };
  switch (spec.type) {
    case OptionType::Bool: {
      const std::string lower = lowerCase(text);
      if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") return true;
      if (lower == "false" || lower == "0" || lower == "no" || lower == "off") return false;
      throw bad();
    }
    case OptionType::Int: {
      char* end = nullptr;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end) throw bad();
      return static_cast<int64_t>(v);
    }
    case OptionType::Float: {
      char* end = nullptr;
      double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end) throw bad();
      return v;
    }
    case OptionType::String:
      return text.size() >= 2 && text.front() == '"' && text.back() == '"'
                 ? text.substr(1, text.size() - 2)
                 : text;
  }
  throw bad();
}

std::string valueText(const OptionValue& v) {
  struct Printer {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      std::ostringstream out;
      out << d;
      return out.str();
    }
    std::string operator()(const std::string& s) const { return '"' + s + '"'; }
  };
  return std::visit(Printer{}, v);
}

}  // namespace

Config::Config() {
  for (const auto& o : optionTable()) entries_[o.key] = {parseText(o, o.defaultValue, "default"), "default"};
}

Config Config::load() {
  Config config;
  const char* dir = std::getenv("AUTOSTAGE_CONF_DIR");
  const char* home = std::getenv("HOME");
  std::string path = dir ? std::string(dir) + "/config.toml"
                         : std::string(home ? home : ".") + "/.autostage/config.toml";
  std::ifstream file(path);
  if (file) {
    std::stringstream text;
    text << file.rdbuf();
    config.applyToml(text.str(), path);
  }
  std::map<std::string, std::string> environment;
  for (char** e = environ; e && *e; ++e) {
    std::string entry = *e;
    size_t eq = entry.find('=');
    if (eq != std::string::npos) environment[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  config.applyEnvironment(environment);
  return config;
}

void Config::applyToml(const std::string& text, const std::string& origin) {
  std::istringstream in(text);
  toml::value doc;
  try {
    doc = toml::parse(in, origin);
  } catch (const std::exception& e) {
    throw ConfigError("config file " + origin + " is not valid TOML: " + e.what());
  }
  // Apply to a copy so a bad value leaves this config as it was.
  Config updated = *this;
  std::vector<std::string> unknown;
  for (const auto& [key, value] : doc.as_table()) {
    const OptionSpec* spec = findOption(key);
    if (!spec) {
      unknown.push_back(key);
      continue;
    }
    auto wrongType = [&, &key = key, &value = value] {  // clang 14: no implicit capture of bindings
      return ConfigError("option '" + key + "' in " + origin + " has value " +
                         toml::format(value) + " but must be a " + optionTypeName(spec->type) +
                         " (" + spec->doc + ")");
    };
    switch (spec->type) {
      case OptionType::Bool:
        if (!value.is_boolean()) throw wrongType();
        updated.setValue(key, value.as_boolean(), origin);
        break;
      case OptionType::Int:
        if (!value.is_integer()) throw wrongType();
        updated.setValue(key, static_cast<int64_t>(value.as_integer()), origin);
        break;
      case OptionType::Float:
        if (value.is_integer()) updated.setValue(key, static_cast<double>(value.as_integer()), origin);
        else if (value.is_floating()) updated.setValue(key, value.as_floating(), origin);
        else throw wrongType();
        break;
      case OptionType::String:
        if (!value.is_string()) throw wrongType();
        updated.setValue(key, value.as_string().str, origin);
        break;
    }
  }
  *this = std::move(updated);
  for (const auto& key : unknown)
    warn("unknown option '" + key + "' in " + origin + " is ignored; known options: " + knownKeys());
}

namespace {

// Note [RaNNC environment variables]
// RaNNC reads RANNC_<KEY> for every key of its config table. The keys of that table (as RaNNC
// documents them) that autostage also has, with the same meaning, are applied from RANNC_<KEY>;
// AUTOSTAGE_<KEY> wins when both are set. A RaNNC key autostage lacks warns, so no RANNC_
// setting is dropped without a word.
const char* const kRanncKeys[] = {
    "show_config_items", "profiling", "graph_profiling", "profile_dump_path", "dump_graph",
    "dump_graph_prefix", "partition_num", "replica_num", "pipeline_num", "validate_comm",
    "display_comm_value", "display_act_value", "consolidate_grads", "profiling_iter",
    "checkpointing", "checkpointing_no_last", "disable_balancing", "opt_param_factor",
    "auto_parallel", "p2p_comm", "decomposer", "mem_limit_gb", "min_partition_num",
    "max_partition_num", "mem_margin", "max_mp_num", "do_uncoarsening", "do_coarsening",
    "min_pipeline", "max_pipeline", "save_deployment", "load_deployment", "deployment_file",
    "save_graph_profile", "load_graph_profile", "graph_profile_file", "trace_events",
    "event_trace_file", "verify_recomp", "dp_search_all", "min_pipeline_bs", "coarsen_by_time",
    "limit_dev_num_pot", "limit_dev_num_more_than_bs", "profile_by_acc", "verify_partitioning",
    "alloc_repl_flat", "sync_allreduce", "partitioning_dry_run_np", "profiler_cache_size"};

// RaNNC's `checkpointing` (recompute every stage, or none) is autostage's `recompute`.
bool ranncCheckpointing(const std::string& value, std::string* recompute) {
  const std::string lower = lowerCase(value);
  if (lower == "true" || lower == "1") *recompute = "always";
  else if (lower == "false" || lower == "0") *recompute = "never";
  else return false;
  return true;
}

}  // namespace

void Config::applyRanncEnvironment(const std::map<std::string, std::string>& environment) {
  const std::string prefix = "RANNC_";
  auto log = logger("Process");
  for (const auto& [name, value] : environment) {
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string key = lowerCase(name.substr(prefix.size()));
    std::string target = key == "checkpointing" ? "recompute" : key, text = value;
    bool ranncKey = std::find(std::begin(kRanncKeys), std::end(kRanncKeys), key) !=
                    std::end(kRanncKeys);
    if (name == "RANNC_CONF_DIR") {
      warn("RANNC_CONF_DIR is ignored: autostage reads $AUTOSTAGE_CONF_DIR/config.toml (same "
           "lower-case keys as RaNNC's rannc_conf.toml for the options both share)");
    } else if (!ranncKey) {
      warn("unknown environment variable " + name + " is ignored: it is not a RaNNC option");
    } else if (!findOption(target)) {
      warn("RaNNC option " + name + " has no autostage equivalent and is ignored; autostage "
           "options: " + knownKeys());
    } else if (environment.count("AUTOSTAGE_" + upperCase(target))) {
      log->info("{}={} is overridden by AUTOSTAGE_{}", name, value, upperCase(target));
    } else {
      if (key == "checkpointing" && !ranncCheckpointing(value, &text))
        throw ConfigError("option 'checkpointing' from env " + name + ": value '" + value +
                          "' is not a bool (RaNNC's checkpointing maps to recompute=always/never)");
      set(target, text, "env " + name);
      log->info("{}={} sets {} = {} (RaNNC compatibility)", name, value, target, text);
    }
  }
}

void Config::applyEnvironment(const std::map<std::string, std::string>& environment) {
  applyRanncEnvironment(environment);
  const std::string prefix = "AUTOSTAGE_";
  for (const auto& [name, value] : environment) {
    if (name.rfind(prefix, 0) != 0 || name == "AUTOSTAGE_CONF_DIR") continue;
    const std::string key = lowerCase(name.substr(prefix.size()));
    if (findOption(key)) set(key, value, "env " + name);
    else warn("unknown environment variable " + name + " is ignored; known options: " + knownKeys());
  }
}

void Config::set(const std::string& key, const std::string& text, const std::string& origin) {
  const OptionSpec* spec = findOption(key);
  if (!spec) throw ConfigError("unknown option '" + key + "' (from " + origin + "); known options: " + knownKeys());
  entries_[key] = {parseText(*spec, text, origin), origin};
}

void Config::setValue(const std::string& key, const OptionValue& value, const std::string& origin) {
  const OptionSpec* spec = findOption(key);
  if (!spec) throw ConfigError("unknown option '" + key + "' (from " + origin + "); known options: " + knownKeys());
  OptionValue v = value;
  if (spec->type == OptionType::Float && std::holds_alternative<int64_t>(v))
    v = static_cast<double>(std::get<int64_t>(v));
  bool ok = (spec->type == OptionType::Bool && std::holds_alternative<bool>(v)) ||
            (spec->type == OptionType::Int && std::holds_alternative<int64_t>(v)) ||
            (spec->type == OptionType::Float && std::holds_alternative<double>(v)) ||
            (spec->type == OptionType::String && std::holds_alternative<std::string>(v));
  if (!ok)
    throw ConfigError("option '" + key + "' (from " + origin + ") got " + valueText(value) +
                      " but must be a " + optionTypeName(spec->type) + " (" + spec->doc + ")");
  entries_[key] = {v, origin};
}

const Config::Entry& Config::entry(const std::string& key, OptionType type) const {
  const OptionSpec* spec = findOption(key);
  AUTOSTAGE_CHECK_AS(ConfigError, spec, "unknown option '", key, "'; known options: ", knownKeys());
  AUTOSTAGE_INTERNAL_ASSERT(spec->type == type, "option '", key, "' is a ",
                            optionTypeName(spec->type), ", read as ", optionTypeName(type));
  return entries_.at(key);
}

bool Config::getBool(const std::string& key) const { return std::get<bool>(entry(key, OptionType::Bool).value); }
int64_t Config::getInt(const std::string& key) const { return std::get<int64_t>(entry(key, OptionType::Int).value); }
double Config::getFloat(const std::string& key) const { return std::get<double>(entry(key, OptionType::Float).value); }
std::string Config::getString(const std::string& key) const {
  return std::get<std::string>(entry(key, OptionType::String).value);
}

std::string Config::origin(const std::string& key) const {
  auto it = entries_.find(key);
  AUTOSTAGE_CHECK_AS(ConfigError, it != entries_.end(), "unknown option '", key, "'");
  return it->second.origin;
}

void Config::warn(const std::string& message) {
  warnings_.push_back(message);
  logger("Process")->warn(message);
}

std::string Config::text(const std::string& key) const {
  auto it = entries_.find(key);
  AUTOSTAGE_CHECK_AS(ConfigError, it != entries_.end(), "unknown option '", key,
                     "'; autostage options are listed by show_config()");
  return valueText(it->second.value);
}

std::string Config::toString() const {
  std::ostringstream out;
  for (const auto& o : optionTable()) {
    const Entry& e = entries_.at(o.key);
    out << o.key << " = " << valueText(e.value) << "  (" << e.origin << ")\n";
  }
  return out.str();
}

Config& globalConfig() {
  // Levels are applied from the loaded config directly: applyLogConfig() must not call back into
  // globalConfig() while its static is being initialised.
  static Config config = [] {
    Config loaded = Config::load();
    applyLogConfig(loaded);
    return loaded;
  }();
  return config;
}

}  // namespace autostage::core
