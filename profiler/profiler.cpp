#include "profiler/profiler.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <sstream>


#include "core/error.h"
#include "core/log.h"
#include "core/proto/profile_file.h"
#include "frontend/torchscript/autocast.h"
#include "profiler/calibration.h"
#include "profiler/comm_profile.h"
#include "profiler/cost_model.h"
#include "profiler/node_pass.h"
#include "profiler/node_runner.h"
#include "profiler/progress.h"
#include "profiler/split_profile.h"

namespace autostage::profiler {
namespace {

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

ProfileKey profileKey(const torchscript::ImportedModel& model,
                      const std::vector<c10::IValue>& exampleInputs,
                      const ProfilerOptions& options, const std::string& deviceKind) {
  ProfileKey key{model.graph.hash(), deviceKind, profileDtype(model, options.precision), ""};
  std::ostringstream text;
  text << key.graphHash << "\nbatch_sizes=";
  const std::vector<int64_t> sizes =
      resolveBatchSizes(options, exampleBatchSizeOf(exampleInputs));
  for (size_t i = 0; i < sizes.size(); ++i) text << (i ? "," : "") << sizes[i];
  text << '\n' << options.measurementText() << '\n' << deviceKind << '\n' << key.dtype;
  key.text = text.str();
  return key;
}

std::string profileCachePath(const ProfilerOptions& options, const ProfileKey& key) {
  if (!options.cacheFile.empty()) return options.cacheFile;
  if (options.cacheDir.empty()) return "";
  std::string device = key.deviceKind;
  for (char& c : device)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return options.cacheDir + "/" + key.graphHash + "-" + device + "-" + key.dtype + "-" +
         core::fnv1aHex(key.text).substr(0, 8) + ".profile";
}

namespace {

// profileNodes; fills `lastValues` (when given and affordable) with every value of the forward
// pass at the largest batch size.
core::GraphProfile profileNodesKeeping(const torchscript::ImportedModel& model,
                                       const std::vector<c10::IValue>& exampleInputs,
                                       MeasurementBackend& backend,
                                       const ProfilerOptions& options, ValueMap* lastValues,
                                       const std::vector<core::NodeId>* only) {
  options.validate();
  const core::Graph& graph = model.graph;
  std::vector<int64_t> batches = resolveBatchSizes(options, exampleBatchSizeOf(exampleInputs));
  std::vector<NodeGroup> groups = nodeGroups(graph);
  if (only) {  // the other groups' nodes run for their values only
    std::vector<char> wanted(graph.nodeCount(), 0);
    for (core::NodeId n : *only) wanted.at(n) = 1;
    groups.erase(std::remove_if(groups.begin(), groups.end(),
                                [&](const NodeGroup& g) { return !wanted[g.key]; }),
                 groups.end());
  }
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
                   {options.warmupRuns, options.repeats, options.normalizeLoad, &phases},
                   options.keptArgsBytes);
  int passCount = 0;
  for (int64_t batch : batches) {
    pass.keepValues(lastValues && batch == batches.back() &&
                    estimatedValueBytes(graph, batch) <= kKeptValuesBudget);
    double passesStart = wallSeconds();
    pass.run(exampleInputs, batch, samples, progress);
    int done = 1;
    while (pass.canRetime() &&
           wantsAnotherPass(done, options.passes, passesStart, options.passSeconds)) {
      pass.retime(samples);
      ++done;
    }
    if (!pass.canRetime() && options.passes > 1)
      core::logger("Profiler")->info("batch size {}: the measured nodes' inputs exceed {:.2f} GiB; "
                                     "timed in one pass", batch, options.keptArgsBytes / (1 << 30));
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
                                MeasurementBackend& backend, const ProfilerOptions& options,
                                const std::vector<core::NodeId>* only) {
  torchscript::AutocastGuard autocast(options.precision, c10::Device(backend.device()).type());
  return profileNodesKeeping(model, exampleInputs, backend, options, nullptr, only);
}

core::GraphProfile profileGraph(const torchscript::ImportedModel& model,
                                const std::vector<c10::IValue>& exampleInputs,
                                MeasurementBackend& backend, const ProfilerOptions& options,
                                const SplitModelMaker& split) {
  options.validate();
  AUTOSTAGE_CHECK(options.splitDegrees.empty() || split, "profiler options ask for times at "
                  "tensor-parallel degrees but no member model was given");
  auto log = core::logger("Profiler");
  log->info("profiler options: {}", options.toString());
  const ProfileKey key = profileKey(model, exampleInputs, options, backend.deviceKind());
  const std::string& hash = key.graphHash;
  std::string path = profileCachePath(options, key);
  if (!path.empty() && std::filesystem::exists(path)) {
    core::GraphProfile cached = core::loadProfileFor(path, hash, key.deviceKind, key.dtype);
    log->info("loaded profile of graph {} from cache {}; skipping profiling", hash, path);
    return cached;
  }
  torchscript::AutocastGuard autocast(options.precision, c10::Device(backend.device()).type());
  ValueMap lastValues;
  core::GraphProfile profile =
      profileNodesKeeping(model, exampleInputs, backend, options, &lastValues, nullptr);
  if (options.calibrationBlocks > 0) {
    double start = wallSeconds();
    CalibrationResult result = calibrate(model, exampleInputs, profile, backend, options,
                                         lastValues.empty() ? nullptr : &lastValues);
    log->info("calibration took {:.1f} s", wallSeconds() - start);
    profile.calibration = result.factor;
    profile.calibrationError = result.error;
  }
  lastValues.clear();
  if (!options.splitDegrees.empty())  // Note [Tensor-parallel profile]
    addSplitTimes(model, exampleInputs, backend, options, split, profile);
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
