// PlanOptions: validation, text form, config reading, and the search candidates they imply.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "core/precision.h"
#include "decomposer/plan.h"
#include "decomposer/plan_option_fields.h"

namespace autostage::decomposer {

std::string scheduleName(Schedule schedule) {
  return schedule == Schedule::GPipe ? "gpipe" : "1f1b";
}

Schedule parseSchedule(const std::string& text) {
  if (text == "gpipe") return Schedule::GPipe;
  if (text == "1f1b") return Schedule::OneFOneB;
  throw ConfigError("schedule '" + text + "' is unknown; use gpipe or 1f1b");
}

void PlanOptions::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError,
                     decomposer == "dp" || decomposer == "data_parallel" || decomposer == "uniform" ||
                         decomposer == "param_balanced",
                     "option decomposer='", decomposer,
                     "' is unknown; use dp, data_parallel, uniform or param_balanced");
  AUTOSTAGE_CHECK_AS(ConfigError, maxBlocks >= 1, "option max_blocks=", maxBlocks,
                     " must be at least 1 (default 256)");
  AUTOSTAGE_CHECK_AS(ConfigError, partitionNum >= 0, "option partition_num=", partitionNum,
                     " must be 0 (planner chooses) or a positive stage count");
  AUTOSTAGE_CHECK_AS(ConfigError, microBatchSize >= 0, "option micro_batch_size=",
                     microBatchSize, " must be >= 0 (0: the planner chooses)");
  AUTOSTAGE_CHECK_AS(ConfigError, pipelineNum >= 0, "option pipeline_num=", pipelineNum,
                     " must be 0 (planner chooses) or a positive micro-batch count");
  AUTOSTAGE_CHECK_AS(ConfigError,
                     minPipeline >= 1 && (maxPipeline == 0 || maxPipeline >= minPipeline),
                     "options min_pipeline=", minPipeline, " and max_pipeline=", maxPipeline,
                     " must satisfy 1 <= min_pipeline <= max_pipeline (or max_pipeline=0: the "
                     "planner's own limit)");
  AUTOSTAGE_CHECK_AS(ConfigError, schedule == "auto" || schedule == "gpipe" || schedule == "1f1b",
                     "option schedule='", schedule, "' is unknown; use gpipe, 1f1b or auto");
  AUTOSTAGE_CHECK_AS(ConfigError, !(usage == PlanUsage::ForwardBackward && schedule == "1f1b"),
                     "option schedule=1f1b cannot run through forward() and backward(), which run "
                     "every micro-batch's forward before any backward (gpipe); call "
                     "model.train_step(...) with a model that returns its loss, or set "
                     "schedule=gpipe or auto");
  AUTOSTAGE_CHECK_AS(ConfigError, recompute == "auto" || recompute == "always" || recompute == "never",
                     "option recompute='", recompute, "' is unknown; use auto, always or never");
  AUTOSTAGE_CHECK_AS(ConfigError, zero == "auto" || zero == "0" || zero == "1", "option zero='",
                     zero, "' is unknown; use auto (planner chooses), 1 (ZeRO-1 in every replicated "
                     "stage) or 0 (never)");
  AUTOSTAGE_CHECK_AS(ConfigError,
                     virtualStages == "auto" || virtualStages == "1" || virtualStages == "2" ||
                         virtualStages == "4",
                     "option virtual_stages='", virtualStages, "' is unknown; use auto (planner "
                     "chooses), 1 (no interleaving), 2 or 4");
  AUTOSTAGE_CHECK_AS(ConfigError,
                     virtualStages == "auto" || virtualStages == "1" ||
                         (usage == PlanUsage::TrainStep && schedule != "gpipe"),
                     "option virtual_stages=", virtualStages, " runs the interleaved 1f1b "
                     "schedule, which only train_step(...) runs and not with schedule=gpipe; call "
                     "model.train_step(...) with a model that returns its loss and schedule=auto or "
                     "1f1b, or set virtual_stages=1 (or auto)");
  AUTOSTAGE_CHECK_AS(ConfigError,
                     tensorParallel == "auto" || tensorParallel == "1" || tensorParallel == "2" ||
                         tensorParallel == "4" || tensorParallel == "8",
                     "option tensor_parallel='", tensorParallel, "' is unknown; use auto (planner "
                     "chooses per stage), 1 (no tensor parallelism), 2, 4 or 8");
  AUTOSTAGE_CHECK_AS(ConfigError, memLimitGb >= 0, "option mem_limit_gb=", memLimitGb,
                     " must be >= 0 (0: use the device's memory)");
  AUTOSTAGE_CHECK_AS(ConfigError, memMargin >= 0 && memMargin < 1, "option mem_margin=", memMargin,
                     " must be in [0, 1)");
  core::parsePrecision(precision);  // throws ConfigError naming the valid precisions
  AUTOSTAGE_CHECK_AS(ConfigError, gradientBucketBytes >= 1, "option gradient_bucket_bytes=",
                     gradientBucketBytes, " must be at least 1 (default 26214400)");
  AUTOSTAGE_CHECK_AS(ConfigError, optParamFactor >= 0, "option opt_param_factor=", optParamFactor,
                     " must be >= 0 (2 for Adam, 0 for SGD)");
}

namespace {

// Note [Plan option fields]: one row per option.
struct Field {
  std::string key;
  std::function<std::string(const PlanOptions&)> get;
  std::function<void(PlanOptions&, const std::string&)> set;
  std::function<void(PlanOptions&, const core::Config&)> read;  // from the config's typed value
};

template <typename T>
T number(const std::string& key, const std::string& text) {
  std::istringstream in(text);
  T value{};
  AUTOSTAGE_CHECK_AS(ConfigError, (in >> value) && in.peek() == std::char_traits<char>::eof(),
                     "option ", key, "='", text, "' is not ",
                     std::is_integral_v<T> ? "an integer" : "a number");
  return value;
}

template <typename T>
std::string textOf(T value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

Field text(const std::string& key, std::string PlanOptions::*member) {
  return {key, [member](const PlanOptions& o) { return o.*member; },
          [member](PlanOptions& o, const std::string& v) { o.*member = v; },
          [key, member](PlanOptions& o, const core::Config& c) { o.*member = c.getString(key); }};
}
Field integer(const std::string& key, int PlanOptions::*member) {
  return {key, [member](const PlanOptions& o) { return textOf(o.*member); },
          [key, member](PlanOptions& o, const std::string& v) { o.*member = number<int>(key, v); },
          [key, member](PlanOptions& o, const core::Config& c) {
            o.*member = static_cast<int>(c.getInt(key));
          }};
}
Field real(const std::string& key, double PlanOptions::*member) {
  return {key, [member](const PlanOptions& o) { return textOf(o.*member); },
          [key, member](PlanOptions& o, const std::string& v) {
            o.*member = number<double>(key, v);
          },
          [key, member](PlanOptions& o, const core::Config& c) { o.*member = c.getFloat(key); }};
}

const std::vector<Field>& fields() {
  static const std::vector<Field> all = {
      text("decomposer", &PlanOptions::decomposer),
      integer("max_blocks", &PlanOptions::maxBlocks),
      integer("partition_num", &PlanOptions::partitionNum),
      integer("pipeline_num", &PlanOptions::pipelineNum),
      integer("min_pipeline", &PlanOptions::minPipeline),
      integer("max_pipeline", &PlanOptions::maxPipeline),
      text("schedule", &PlanOptions::schedule),
      text("recompute", &PlanOptions::recompute),
      text("zero", &PlanOptions::zero),
      text("virtual_stages", &PlanOptions::virtualStages),
      real("mem_limit_gb", &PlanOptions::memLimitGb),
      real("mem_margin", &PlanOptions::memMargin),
      real("opt_param_factor", &PlanOptions::optParamFactor),
      // Bytes, written as an integer (a request's text stays as before).
      {"gradient_bucket_bytes",
       [](const PlanOptions& o) { return textOf(static_cast<int64_t>(o.gradientBucketBytes)); },
       [](PlanOptions& o, const std::string& v) {
         o.gradientBucketBytes = number<double>("gradient_bucket_bytes", v);
       },
       [](PlanOptions& o, const core::Config& c) {
         o.gradientBucketBytes = static_cast<double>(c.getInt("gradient_bucket_bytes"));
       }},
      text("precision", &PlanOptions::precision),
      text("tensor_parallel", &PlanOptions::tensorParallel),
      integer("micro_batch_size", &PlanOptions::microBatchSize),
  };
  return all;
}

const Field& field(const std::string& key) {
  for (const Field& f : fields())
    if (f.key == key) return f;
  std::string known;
  for (const Field& f : fields()) known += (known.empty() ? "" : ", ") + f.key;
  throw ConfigError("planner option '" + key + "' is unknown; known: " + known);
}

}  // namespace

const std::vector<std::string>& planOptionKeys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const Field& f : fields()) k.push_back(f.key);
    return k;
  }();
  return keys;
}

std::string planOptionText(const PlanOptions& options, const std::string& key) {
  return field(key).get(options);
}

void setPlanOption(PlanOptions& options, const std::string& key, const std::string& text) {
  field(key).set(options, text);
}

std::string PlanOptions::toString() const {
  std::string out;
  for (const Field& f : fields()) out += f.key + "=" + f.get(*this) + " ";
  return out + "usage=" + usageName(usage);
}

PlanOptions PlanOptions::fromConfig(const core::Config& config) {
  PlanOptions o;
  for (const Field& f : fields()) f.read(o, config);
  o.validate();
  return o;
}

std::vector<int> PlanOptions::microBatchCandidates(int64_t batch) const {
  if (pipelineNum > 0) return {pipelineNum};
  std::vector<int> result;
  if (microBatchSize > 0) {  // Note [Fixed micro-batch size]: m x replicas = batch / N
    if (batch % microBatchSize != 0) return result;
    const int64_t samples = batch / microBatchSize;
    for (int m = std::max(1, minPipeline); m <= pipelineLimit() && m <= samples; ++m)
      if (samples % m == 0) result.push_back(m);
    return result;
  }
  // Note [Free micro-batch counts]: powers of two, and every count splitting the batch evenly.
  const int limit = pipelineLimit();
  auto inRange = [&](int64_t m) { return m >= minPipeline && m <= limit; };
  for (int64_t m = 1; m <= limit; m *= 2)
    if (inRange(m)) result.push_back(static_cast<int>(m));
  for (int64_t d = 1; d * d <= batch; ++d) {
    if (batch % d != 0) continue;
    for (int64_t m : {d, batch / d})
      if (inRange(m)) result.push_back(static_cast<int>(m));
  }
  std::sort(result.begin(), result.end());
  result.erase(std::unique(result.begin(), result.end()), result.end());
  return result;
}

std::vector<bool> PlanOptions::recomputeCandidates() const {
  if (usage == PlanUsage::Inference) return {false};
  if (recompute == "always") return {true};
  if (recompute == "never") return {false};
  return {false, true};
}

std::vector<bool> PlanOptions::zeroCandidates() const {
  if (usage == PlanUsage::Inference || zero == "0") return {false};
  if (zero == "1") return {true};
  return {false, true};
}

std::vector<int> PlanOptions::virtualStageCandidates() const {
  if (usage != PlanUsage::TrainStep || schedule == "gpipe") return {1};
  if (virtualStages == "auto") return {1, 2, 4};
  return {std::stoi(virtualStages)};
}

std::vector<int> PlanOptions::tensorParallelCandidates(int devicesPerNode) const {
  if (tensorParallel == "auto") {
    std::vector<int> result;
    for (int t : {1, 2, 4, 8})
      if (devicesPerNode % t == 0) result.push_back(t);
    return result;
  }
  const int t = std::stoi(tensorParallel);
  AUTOSTAGE_CHECK_AS(ConfigError, t >= 1 && devicesPerNode % t == 0, "option tensor_parallel=",
                     tensorParallel, " needs ", t, " ranks of one node per stage replica, but a "
                     "node has ", devicesPerNode, " devices; use a degree dividing ",
                     devicesPerNode, ", auto or 1");
  return {t};
}

std::vector<Schedule> PlanOptions::scheduleCandidates() const {
  if (usage != PlanUsage::TrainStep) return {Schedule::GPipe};
  if (schedule == "auto") return {Schedule::GPipe, Schedule::OneFOneB};
  return {parseSchedule(schedule)};
}

std::string Plan::toString() const {
  std::ostringstream out;
  out << decomposer << " micro_batches=" << microBatchCount << " schedule="
      << scheduleName(schedule) << (virtualStages > 1 ? " v=" + std::to_string(virtualStages) : "")
      << " predicted=" << predictedSeconds << "s search=" << searchSeconds
      << "s stages:";
  for (const StagePlan& s : stages)
    out << " [" << s.firstBlock << ".." << s.lastBlock << " x" << s.replicaCount << " @"
        << s.firstRank << (s.recompute ? " rc" : "") << (s.zero ? " zero" : "")
        << (s.tensorParallel > 1 ? " tp=" + std::to_string(s.tensorParallel) : "") << "]";
  return out.str();
}

}  // namespace autostage::decomposer
