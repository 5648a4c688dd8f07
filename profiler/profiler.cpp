#include "profiler/profiler.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <sstream>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include <torch/torch.h>

#include "core/error.h"
#include "core/log.h"
#include "core/proto/profile_file.h"
#include "core/torchscript/autocast.h"
#include "profiler/calibration.h"
#include "profiler/comm_profile.h"
#include "profiler/cost_model.h"
#include "profiler/node_runner.h"
#include "profiler/progress.h"

namespace autostage::profiler {
namespace {

double wallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A unit of the forward pass: a node group (profiled) or a node outside every group (run only
// to produce values). Units run in order of their last node, which respects dependencies.
struct Unit {
  core::NodeId last = core::kNoNode;
  int group = -1;
  std::vector<core::NodeId> nodes;
  std::unique_ptr<torchscript::ExportedFunction> function;
  std::string exportFailure;
  int sameAs = -1;  // earlier group with an identical signature (Note [Identical node groups])
};

// Note [Identical node groups]
// Transformer layers and ResNet blocks repeat the same node groups: same operators, attributes
// and input types (shapes, dtypes, classes, parameter shapes included). Their costs do not
// depend on the values, so only the first group of each signature is measured; the others reuse
// its measurement at each batch size (they still run once, without autograd, to produce the
// values later groups read). A group whose representative failed at a batch is measured itself.
std::string attributeKey(const core::AttributeValue& value) {
  std::ostringstream out;
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, core::TensorData>) {
          out << "t" << static_cast<int>(v.dtype) << ":";
          for (int64_t d : v.shape) out << d << ",";
          out << std::hash<std::string>()(v.bytes);
        } else if constexpr (std::is_same_v<V, int64_t> || std::is_same_v<V, double> ||
                             std::is_same_v<V, std::string>) {
          out << v;
        } else {
          for (const auto& e : v) out << e << ",";
        }
      },
      value);
  return out.str();
}

std::string groupSignature(const core::Graph& graph, const std::vector<core::NodeId>& nodes) {
  std::unordered_map<core::ValueId, std::string> local;
  std::ostringstream out;
  int external = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const core::Node& node = graph.node(nodes[i]);
    out << node.kind << "{" << node.body << "}(";
    for (core::ValueId v : node.inputs) {
      auto it = local.find(v);
      if (it == local.end()) {  // outside values numbered by first use: add(x, x) != add(x, y)
        const core::Value& value = graph.value(v);
        std::string name = "$" + std::to_string(external++) + ":" + value.type.toString() + "/" +
                           std::to_string(int(value.cls)) +
                           (value.producer == core::kNoNode ? "/in" : "");
        it = local.emplace(v, name).first;
      }
      out << it->second << ";";
    }
    out << ")[";
    for (const core::Attribute& a : node.attributes)
      out << a.name << "=" << attributeKey(a.value) << ";";
    out << "]\n";
    for (size_t k = 0; k < node.outputs.size(); ++k)
      local[node.outputs[k]] = "%" + std::to_string(i) + "." + std::to_string(k);
  }
  return out.str();
}

void markIdenticalGroups(const core::Graph& graph, std::vector<Unit>& units) {
  std::unordered_map<std::string, int> first;
  for (Unit& unit : units) {
    if (unit.group < 0) continue;
    auto [it, inserted] = first.emplace(groupSignature(graph, unit.nodes), unit.group);
    if (!inserted) unit.sameAs = it->second;
  }
}

// (position in `nodes`, output index) of each boundary output: where the outputs come from.
std::vector<std::pair<size_t, size_t>> outputPositions(const core::Graph& graph,
                                                       const std::vector<core::NodeId>& nodes,
                                                       const std::vector<core::ValueId>& outputs) {
  std::vector<std::pair<size_t, size_t>> positions;
  for (core::ValueId v : outputs) {
    auto at = std::find(nodes.begin(), nodes.end(), graph.value(v).producer);
    const auto& produced = graph.node(*at).outputs;
    positions.emplace_back(at - nodes.begin(),
                           std::find(produced.begin(), produced.end(), v) - produced.begin());
  }
  return positions;
}

// Exports every unit. A group identical to an earlier one (Note [Identical node groups]) runs
// that group's compiled function on its own values when its boundary has the same layout:
// exporting and optimizing it again cost most of a 24-layer encoder's profiling time.
void exportUnits(const core::Graph& graph, std::vector<Unit>& units) {
  std::unordered_map<int, size_t> unitOfGroup;
  for (size_t u = 0; u < units.size(); ++u) {
    Unit& unit = units[u];
    if (unit.group >= 0) unitOfGroup[unit.group] = u;
    try {
      if (unit.sameAs >= 0) {
        const Unit& first = units[unitOfGroup.at(unit.sameAs)];
        core::Boundary mine = graph.boundary(unit.nodes);
        if (first.function && mine.inputs.size() == first.function->inputs().size() &&
            outputPositions(graph, unit.nodes, mine.outputs) ==
                outputPositions(graph, first.nodes, first.function->outputs())) {
          unit.function = std::make_unique<torchscript::ExportedFunction>(
              first.function->rebind(mine.inputs, mine.outputs));
          continue;
        }
      }
      unit.function = std::make_unique<torchscript::ExportedFunction>(
          torchscript::exportSubgraph(graph, unit.nodes));
    } catch (const std::exception& e) {
      unit.exportFailure = std::string("cannot export: ") + e.what();
    }
  }
}

std::vector<Unit> buildUnits(const core::Graph& graph, const std::vector<NodeGroup>& groups) {
  std::vector<Unit> units;
  std::vector<bool> grouped(graph.nodeCount(), false);
  for (size_t g = 0; g < groups.size(); ++g) {
    units.push_back({groups[g].key, static_cast<int>(g), groups[g].nodes, nullptr, ""});
    for (core::NodeId n : groups[g].nodes) grouped[n] = true;
  }
  for (core::NodeId n = 0; n < static_cast<core::NodeId>(graph.nodeCount()); ++n)
    if (!grouped[n]) units.push_back({n, -1, {n}, nullptr, ""});
  std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.last < b.last; });
  return units;
}

// Measurements of one group at each batch size (absent where it failed).
struct GroupSamples {
  std::vector<int64_t> batches;
  std::vector<RunMeasurement> runs;
  std::string failure;
  int64_t failedBatch = -1;
};

// The interpreter wraps errors in a multi-line traceback; its last non-empty line says what
// went wrong (e.g. `RuntimeError: shape '[8, 16]' is invalid for input of size 256`).
std::string lastLine(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last.empty() ? text : last;
}

// Arguments of measured node groups kept for later passes (Note [Measurement passes]); beyond
// this a batch size is measured in one pass.
constexpr double kSavedArgsBudget = 2.0 * (1 << 30);

class ForwardPass {
 public:
  ForwardPass(const torchscript::ImportedModel& model, std::vector<Unit>& units,
              MeasurementBackend& backend, const RunSettings& settings)
      : model_(model), units_(units), backend_(backend), settings_(settings) {}

  // Runs every unit at `batch`, measuring group units into `samples` (the first pass of Note
  // [Measurement passes] in node_runner.h). Keeps the arguments of the groups it measured for
  // later passes (retime) while they fit in kSavedArgsBudget.
  void run(const std::vector<c10::IValue>& inputs, int64_t batch,
           std::vector<GroupSamples>& samples, ProgressReporter& progress) {
    values_ = seedValues(model_, inputs, batch);
    countUses();
    saved_.clear();
    copied_.clear();
    savedStorages_.clear();
    savedBytes_ = 0;
    savingArgs_ = true;
    for (Unit& unit : units_) {
      const GroupSamples* reuse = reusable(unit, batch, samples);
      if (reuse) ++reused_, copied_.emplace_back(unit.group, unit.sameAs);
      std::string failure = runUnit(unit, batch, unit.group >= 0 ? &samples[unit.group] : nullptr,
                                    reuse);
      if (unit.group >= 0) {
        if (!failure.empty()) recordFailure(unit, batch, failure, samples[unit.group]);
        progress.advance();
      }
      release(unit);
    }
    if (keep_) kept_ = std::move(values_);
    values_.clear();
  }

  // Whether retime can run (the last run's measured arguments were all kept).
  bool canRetime() const { return savingArgs_; }

  // A later pass: times every group the last run measured again, from its kept arguments, and
  // gives the groups that reuse a measurement the updated one.
  void retime(std::vector<GroupSamples>& samples) {
    for (const SavedArgs& s : saved_) {
      const Unit& unit = units_[s.unit];
      try {
        samples[unit.group].runs.back().addPass(
            timeRuns(model_.graph, *unit.function, s.args, backend_, settings_));
      } catch (const std::exception& e) {  // measured before; a later failure costs this pass only
        core::logger("Profiler")->warn("{}: a later timing pass failed: {}",
                                       nodeLabel(model_.graph, unit.last), lastLine(e.what()));
      }
    }
    for (auto [group, representative] : copied_)
      samples[group].runs.back() = samples[representative].runs.back();
  }

  // Makes the next run keep every value it computes (see takeKept).
  void keepValues(bool keep) { keep_ = keep; }
  ValueMap takeKept() { return std::move(kept_); }

  // Wall time of units run only to produce values (outside every group, or reusing).
  double contextSeconds() const { return contextSeconds_; }
  // Group measurements copied from an identical group (Note [Identical node groups]).
  int64_t reusedCount() const { return reused_; }

 private:
  // Returns "" on success, else what went wrong.
  // The representative's measurement at `batch` when `unit` may reuse it.
  static const GroupSamples* reusable(const Unit& unit, int64_t batch,
                                      const std::vector<GroupSamples>& samples) {
    if (unit.sameAs < 0) return nullptr;
    const GroupSamples& first = samples[unit.sameAs];
    bool measured = !first.batches.empty() && first.batches.back() == batch;
    return measured ? &first : nullptr;
  }

  // Keeps `args` of the measured unit at `index` for retime, unless the kept arguments would
  // exceed kSavedArgsBudget (then no later pass runs at this batch size).
  void saveArgs(size_t index, const std::vector<c10::IValue>& args) {
    if (!savingArgs_) return;
    for (const c10::IValue& a : args) {
      if (!a.isTensor()) continue;
      const at::Tensor& t = a.toTensor();
      if (t.has_storage() && savedStorages_.insert(t.storage().unsafeGetStorageImpl()).second)
        savedBytes_ += static_cast<double>(t.storage().nbytes());
    }
    if (savedBytes_ > kSavedArgsBudget) {
      savingArgs_ = false;
      saved_.clear();
      return;
    }
    saved_.push_back({index, args});
  }

  // Runs `unit`; measures it into `samples` (copying `reuse`'s measurement at `batch` instead
  // when given). Returns "" on success, else what went wrong.
  std::string runUnit(Unit& unit, int64_t batch, GroupSamples* samples,
                      const GroupSamples* reuse) {
    if (!unit.function) return unit.exportFailure;
    std::vector<c10::IValue> args;
    try {
      args = gatherArgs(model_.graph, *unit.function, values_);
      std::vector<c10::IValue> outputs;
      if (samples && !reuse) {
        RunMeasurement m =
            measureRun(model_.graph, *unit.function, args, backend_, settings_, &outputs);
        samples->batches.push_back(batch);
        samples->runs.push_back(m);
        saveArgs(static_cast<size_t>(&unit - units_.data()), args);
      } else {
        double start = wallSeconds();
        torch::NoGradGuard noGrad;
        outputs = executeFunction(*unit.function, args);
        contextSeconds_ += wallSeconds() - start;
        if (reuse) {
          samples->batches.push_back(batch);
          samples->runs.push_back(reuse->runs.back());
        }
      }
      for (size_t i = 0; i < outputs.size(); ++i) values_[unit.function->outputs()[i]] = outputs[i];
    } catch (const std::exception& e) {
      std::string shapes = describeInputs(model_.graph, args, unit.function->inputs());
      return lastLine(e.what()) + (shapes.empty() ? "" : " (inputs: " + shapes + ")");
    }
    return "";
  }

  void recordFailure(const Unit& unit, int64_t batch, const std::string& failure,
                     GroupSamples& samples) {
    std::string label = nodeLabel(model_.graph, unit.last);
    core::logger("Profiler")->warn("{} failed at batch size {}: {}", label, batch, failure);
    if (samples.failure.empty()) {
      std::ostringstream out;
      out << label << " failed at batch size " << batch << ": " << failure;
      samples.failure = out.str();
      samples.failedBatch = batch;
    }
  }

  void countUses() {
    remaining_.assign(model_.graph.valueCount(), 0);
    for (const Unit& unit : units_)
      if (unit.function)
        for (core::ValueId v : unit.function->inputs()) ++remaining_[v];
  }

  // Drops values no later unit reads (graph outputs are kept).
  void release(const Unit& unit) {
    if (!unit.function || keep_) return;
    for (core::ValueId v : unit.function->inputs())
      if (--remaining_[v] == 0 && !model_.graph.isGraphOutput(v)) values_.erase(v);
  }

  const torchscript::ImportedModel& model_;
  std::vector<Unit>& units_;
  MeasurementBackend& backend_;
  RunSettings settings_;
  ValueMap values_;
  std::vector<int> remaining_;
  double contextSeconds_ = 0;
  int64_t reused_ = 0;
  bool keep_ = false;
  ValueMap kept_;
  // For retime: arguments of the measured units, and (group, representative) of the reusing ones.
  struct SavedArgs {
    size_t unit;
    std::vector<c10::IValue> args;
  };
  std::vector<SavedArgs> saved_;
  std::vector<std::pair<int, int>> copied_;
  std::unordered_set<const void*> savedStorages_;
  double savedBytes_ = 0;
  bool savingArgs_ = true;
};

// Values of the last profiling pass are kept for calibration (which then runs no forward pass
// of its own) when they fit in this many bytes.
constexpr double kKeptValuesBudget = 2.0 * (1 << 30);

double estimatedValueBytes(const core::Graph& graph, int64_t batch) {
  double scale = static_cast<double>(batch) / static_cast<double>(exampleBatchSize(graph));
  double total = 0;
  for (const core::Value& v : graph.values())
    if (v.producer != core::kNoNode && v.type.bytes() > 0) total += v.type.bytes() * scale;
  return total;
}

core::NodeProfile fitGroup(core::NodeId key, const GroupSamples& s, int64_t paramBytes) {
  core::NodeProfile p;
  p.node = key;
  p.paramBytes = paramBytes;
  p.failure = s.failure;
  if (!s.failure.empty()) {
    p.maxBatch = 0;
    for (int64_t b : s.batches)
      if (b < s.failedBatch) p.maxBatch = std::max(p.maxBatch, b);
  }
  if (s.runs.empty()) return p;
  std::vector<double> xs(s.batches.begin(), s.batches.end());
  auto fit = [&](auto field) {
    std::vector<double> ys;
    for (const RunMeasurement& m : s.runs) ys.push_back(static_cast<double>(field(m)));
    return fitLinear(xs, ys);
  };
  p.forwardSeconds = fit([](const RunMeasurement& m) { return m.forwardSeconds; });
  p.backwardSeconds = fit([](const RunMeasurement& m) { return m.backwardSeconds; });
  p.outputBytes = fit([](const RunMeasurement& m) { return m.outputBytes; });
  p.activationBytes = fit([](const RunMeasurement& m) { return m.activationBytes(); });
  p.workingBytes = fit([](const RunMeasurement& m) { return m.workingBytes(); });
  return p;
}

}  // namespace

std::string nodeLabel(const core::Graph& graph, core::NodeId node) {
  const core::Node& n = graph.node(node);
  std::ostringstream out;
  out << "node " << node << " " << n.kind;
  if (!n.scope.empty()) out << " (" << n.scope << ")";
  if (!n.outputs.empty()) out << " -> " << graph.value(n.outputs[0]).name;
  return out.str();
}

std::vector<int64_t> resolveBatchSizes(const ProfilerOptions& options, int64_t exampleBatch) {
  std::vector<int64_t> sizes = options.batchSizes;
  if (sizes.empty()) {
    // Micro-batches are a fraction of the example batch; small sizes keep profiling fast and
    // the linear fit extrapolates (a quarter and a half; 1 and 2 for tiny batches).
    int64_t small = std::max<int64_t>(1, exampleBatch / 4);
    int64_t large = std::min(exampleBatch, std::max(small + 1, exampleBatch / 2));
    sizes.push_back(small);
    if (large > small) sizes.push_back(large);
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

std::string modelDtype(const torchscript::ImportedModel& model) {
  for (const at::Tensor& t : model.paramTensors)
    if (t.is_floating_point()) return c10::toString(t.scalar_type());
  for (core::ValueId v : model.graph.batchInputs()) {
    const core::Type& type = model.graph.value(v).type;
    if (type.isTensor() && core::isFloatingPoint(type.dtype())) return core::dtypeName(type.dtype());
  }
  return "Float";
}

std::string profileDtype(const torchscript::ImportedModel& model, core::Precision precision) {
  std::string dtype = modelDtype(model);
  if (precision != core::Precision::Fp32) dtype += "-autocast-" + core::precisionName(precision);
  return dtype;
}

std::string profileCachePath(const ProfilerOptions& options, const std::string& graphHash,
                             const std::string& deviceKind, const std::string& dtype) {
  if (!options.cacheFile.empty()) return options.cacheFile;
  if (options.cacheDir.empty()) return "";
  std::string device = deviceKind;
  for (char& c : device)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return options.cacheDir + "/" + graphHash + "-" + device + "-" + dtype + ".profile";
}

namespace {

// profileNodes; fills `lastValues` (when given and affordable) with every value of the forward
// pass at the largest batch size.
core::GraphProfile profileNodesKeeping(const torchscript::ImportedModel& model,
                                       const std::vector<c10::IValue>& exampleInputs,
                                       MeasurementBackend& backend,
                                       const ProfilerOptions& options, ValueMap* lastValues) {
  options.validate();
  const core::Graph& graph = model.graph;
  std::vector<int64_t> batches = resolveBatchSizes(options, exampleBatchSizeOf(exampleInputs));
  std::vector<NodeGroup> groups = nodeGroups(graph);
  double start = wallSeconds();
  std::vector<Unit> units = buildUnits(graph, groups);
  if (options.reuseIdenticalGroups) markIdenticalGroups(graph, units);
  exportUnits(graph, units);
  double exportSeconds = wallSeconds() - start;
  std::vector<GroupSamples> samples(groups.size());
  ProgressReporter progress(static_cast<int64_t>(groups.size() * batches.size()), "nodes",
                            options.progressBar);
  PhaseTimes phases;
  ForwardPass pass(model, units, backend,
                   {options.warmupRuns, options.repeats, options.normalizeLoad, &phases});
  int passCount = 0;
  for (int64_t batch : batches) {
    pass.keepValues(lastValues && batch == batches.back() &&
                    estimatedValueBytes(graph, batch) <= kKeptValuesBudget);
    double passesStart = wallSeconds();
    pass.run(exampleInputs, batch, samples, progress);
    int done = 1;
    // Note [Measurement passes] in node_runner.h: at least options.passes, spanning at least
    // options.passSeconds (at most kMaxPasses).
    while (pass.canRetime() && done < kMaxPasses &&
           (done < options.passes || wallSeconds() - passesStart < options.passSeconds)) {
      pass.retime(samples);
      ++done;
    }
    if (!pass.canRetime() && options.passes > 1)
      core::logger("Profiler")->info("batch size {}: the measured nodes' inputs exceed {:.0f} GiB; "
                                     "timed in one pass", batch, kSavedArgsBudget / (1 << 30));
    passCount += done;
  }
  if (lastValues) *lastValues = pass.takeKept();

  core::GraphProfile profile;
  profile.graphHash = graph.hash();
  profile.deviceKind = backend.deviceKind();
  profile.dtype = profileDtype(model, options.precision);
  profile.batchSizes = batches;
  profile.nodes.resize(graph.nodeCount());
  for (core::NodeId n = 0; n < static_cast<core::NodeId>(graph.nodeCount()); ++n)
    profile.nodes[n].node = n;
  std::vector<int64_t> paramBytes = paramBytesByNode(graph);
  int failures = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    core::NodeId key = groups[g].key;
    profile.nodes[key] = fitGroup(key, samples[g], paramBytes[key]);
    failures += samples[g].failure.empty() ? 0 : 1;
  }
  progress.finish("profiled " + std::to_string(groups.size()) + " node groups of " +
                  std::to_string(graph.nodeCount()) + " nodes at " +
                  std::to_string(batches.size()) + " batch sizes in " + std::to_string(passCount) +
                  " timing passes (" + std::to_string(failures) + " failed)");
  core::logger("Profiler")->info(
      "node profiling time: export {:.1f} s, memory runs {:.1f} s, timed runs {:.1f} s, load "
      "probes {:.1f} s, value-only runs {:.1f} s ({} measurements; {} reused from identical "
      "node groups)", exportSeconds, phases.memoryRuns, phases.timedRuns, phases.loadProbes,
      pass.contextSeconds(), phases.measurements, pass.reusedCount());
  return profile;
}

}  // namespace

core::GraphProfile profileNodes(const torchscript::ImportedModel& model,
                                const std::vector<c10::IValue>& exampleInputs,
                                MeasurementBackend& backend, const ProfilerOptions& options) {
  torchscript::AutocastGuard autocast(options.precision);
  return profileNodesKeeping(model, exampleInputs, backend, options, nullptr);
}

core::GraphProfile profileGraph(const torchscript::ImportedModel& model,
                                const std::vector<c10::IValue>& exampleInputs,
                                MeasurementBackend& backend, const ProfilerOptions& options) {
  options.validate();
  auto log = core::logger("Profiler");
  log->info("profiler options: {}", options.toString());
  std::string hash = model.graph.hash(), dtype = profileDtype(model, options.precision);
  std::string path = profileCachePath(options, hash, backend.deviceKind(), dtype);
  if (!path.empty() && std::filesystem::exists(path)) {
    core::GraphProfile cached = core::loadProfileFor(path, hash, backend.deviceKind(), dtype);
    log->info("loaded profile of graph {} from cache {}; skipping profiling", hash, path);
    return cached;
  }
  torchscript::AutocastGuard autocast(options.precision);
  ValueMap lastValues;
  core::GraphProfile profile =
      profileNodesKeeping(model, exampleInputs, backend, options, &lastValues);
  if (options.calibrationBlocks > 0) {
    double start = wallSeconds();
    CalibrationResult result = calibrate(model, exampleInputs, profile, backend, options,
                                         lastValues.empty() ? nullptr : &lastValues);
    log->info("calibration took {:.1f} s", wallSeconds() - start);
    profile.calibration = result.factor;
    profile.calibrationError = result.error;
  }
  profile.comm = configuredCommProfile();
  if (!path.empty()) {
    std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    core::saveProfile(profile, path);
    log->info("saved profile of graph {} to {}", hash, path);
  }
  return profile;
}

}  // namespace autostage::profiler
