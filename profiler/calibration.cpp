#include "profiler/calibration.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

#include <ATen/core/grad_mode.h>

#include "core/error.h"
#include "core/log.h"
#include "profiler/cost_model.h"

namespace autostage::profiler {
namespace {

std::vector<core::NodeId> range(core::NodeId begin, core::NodeId end) {
  std::vector<core::NodeId> ids;
  for (core::NodeId n = begin; n < end; ++n) ids.push_back(n);
  return ids;
}

int64_t paramBytesFed(const core::Graph& graph, const std::vector<core::ValueId>& inputs) {
  int64_t total = 0;
  for (core::ValueId v : inputs) {
    const core::Value& value = graph.value(v);
    if (value.producer == core::kNoNode && value.cls == core::ValueClass::Param)
      total += std::max<int64_t>(0, value.type.bytes());
  }
  return total;
}

bool covers(const ValueMap& values, const core::Graph& graph,
            const std::vector<core::NodeId>& nodes) {
  for (core::ValueId v : graph.boundary(nodes).inputs)
    if (!values.count(v)) return false;
  return true;
}

// Producers (ascending) of the block's inputs that derive from parameters/constants alone, with
// their own such producers; inputs found in `values` (when given) are not followed. Sets
// *complete to false when an input outside `values` comes from a BATCH/LOSS node or is a
// graph input.
std::vector<core::NodeId> paramDerivedProducers(const core::Graph& graph,
                                                const std::vector<core::NodeId>& nodes,
                                                const ValueMap* values, bool* complete = nullptr) {
  std::vector<core::NodeId> producers;
  std::vector<bool> chosen(graph.nodeCount(), false);
  std::vector<core::ValueId> pending = graph.boundary(nodes).inputs;
  while (!pending.empty()) {
    core::ValueId v = pending.back();
    pending.pop_back();
    if (values && values->count(v)) continue;
    core::NodeId producer = graph.value(v).producer;
    core::ValueClass cls =
        producer == core::kNoNode ? core::ValueClass::Batch : graph.nodeClass(producer);
    if (cls == core::ValueClass::Batch || cls == core::ValueClass::Loss) {
      if (complete) *complete = false;
      continue;
    }
    if (chosen[producer]) continue;
    chosen[producer] = true;
    producers.push_back(producer);
    for (core::ValueId input : graph.node(producer).inputs) pending.push_back(input);
  }
  std::sort(producers.begin(), producers.end());
  return producers;
}

// Adds the block's missing inputs to `values` when they derive from parameters alone (a
// weight's transpose inside another node group, which the profiler's pass never returned) by
// running just their producers. False when something else is missing or cannot be run.
bool addParamDerivedInputs(const torchscript::ImportedModel& model,
                           const std::vector<core::NodeId>& nodes, ValueMap& values) {
  const core::Graph& graph = model.graph;
  bool complete = true;
  std::vector<core::NodeId> producers = paramDerivedProducers(graph, nodes, &values, &complete);
  if (!complete) return false;
  if (producers.empty()) return true;
  try {
    torchscript::ExportedFunction function = torchscript::exportSubgraph(graph, producers);
    std::vector<c10::IValue> args = gatherArgs(graph, function, values);
    at::NoGradGuard noGrad;
    std::vector<c10::IValue> outputs = executeFunction(function, std::move(args));
    for (size_t i = 0; i < outputs.size(); ++i) values[function.outputs()[i]] = outputs[i];
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

double relativeError(double predicted, double measured) {
  return measured > 0 ? std::abs(predicted - measured) / measured : 0;
}

}  // namespace

ForwardPrefix::ForwardPrefix(const torchscript::ImportedModel& model,
                             const std::vector<c10::IValue>& exampleInputs, int64_t batch)
    : model_(model), values_(seedValues(model, exampleInputs, batch)) {}

const ValueMap& ForwardPrefix::advanceTo(core::NodeId end) {
  if (end <= position_) return values_;
  torchscript::ExportedFunction segment =
      torchscript::exportSubgraph(model_.graph, range(position_, end));
  std::vector<c10::IValue> args = gatherArgs(model_.graph, segment, values_);
  at::NoGradGuard noGrad;
  std::vector<c10::IValue> outputs = executeFunction(segment, std::move(args));
  for (size_t i = 0; i < outputs.size(); ++i) values_[segment.outputs()[i]] = outputs[i];
  position_ = end;
  return values_;
}

namespace {

// A block ready to be measured: its exported function and arguments.
struct PreparedBlock {
  std::optional<torchscript::ExportedFunction> function;
  std::vector<c10::IValue> args;
};

void checkBlockRange(const core::Graph& graph, core::NodeId begin, core::NodeId end) {
  AUTOSTAGE_CHECK_AS(PlanError, 0 <= begin && begin < end &&
                                    end <= static_cast<core::NodeId>(graph.nodeCount()),
                     "block [", begin, ", ", end, ") is not a non-empty node range of graph '",
                     graph.name(), "' with ", graph.nodeCount(), " nodes");
}

PreparedBlock prepareBlock(const torchscript::ImportedModel& model, const ValueMap& values,
                           core::NodeId begin, core::NodeId end) {
  checkBlockRange(model.graph, begin, end);
  // A stage computes values derived from its parameters alone (a weight's transpose made by
  // the node before `begin`) itself: include their producers rather than feeding copies.
  std::vector<core::NodeId> nodes = range(begin, end);
  std::vector<core::NodeId> producers = paramDerivedProducers(model.graph, nodes, nullptr);
  std::optional<torchscript::ExportedFunction> block;
  if (!producers.empty()) {
    std::vector<core::NodeId> widened = producers;
    widened.insert(widened.end(), nodes.begin(), nodes.end());
    std::sort(widened.begin(), widened.end());
    widened.erase(std::unique(widened.begin(), widened.end()), widened.end());
    try {
      block.emplace(torchscript::exportSubgraph(model.graph, widened));
    } catch (const std::exception&) {  // not convex (e.g. a tied weight): feed copies
    }
  }
  if (!block) block.emplace(torchscript::exportSubgraph(model.graph, nodes));
  std::vector<c10::IValue> args = gatherArgs(model.graph, *block, values);
  return {std::move(block), std::move(args)};
}

// Measures the blocks in at least `passes` passes over all of them, spanning at least
// `minSeconds` (at most kMaxPasses; Note [Measurement passes]).
std::vector<BlockMeasurement> measurePrepared(const torchscript::ImportedModel& model,
                                              const std::vector<PreparedBlock>& blocks,
                                              MeasurementBackend& backend,
                                              const RunSettings& settings, int passes,
                                              double minSeconds) {
  const double start = wallSeconds();
  std::vector<RunMeasurement> runs;
  for (const PreparedBlock& b : blocks)
    runs.push_back(measureRun(model.graph, *b.function, b.args, backend, settings));
  for (int pass = 1; wantsAnotherPass(pass, passes, start, minSeconds); ++pass)
    for (size_t i = 0; i < blocks.size(); ++i)
      runs[i].addPass(timeRuns(model.graph, *blocks[i].function, blocks[i].args, backend, settings));
  std::vector<BlockMeasurement> result;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const RunMeasurement& run = runs[i];
    result.push_back({run.forwardSeconds, run.backwardSeconds,
                      paramBytesFed(model.graph, blocks[i].function->inputs()) + run.inputBytes +
                          run.peakBytes});
  }
  return result;
}

}  // namespace

BlockMeasurement measureBlock(const torchscript::ImportedModel& model,
                              const std::vector<c10::IValue>& exampleInputs, core::NodeId begin,
                              core::NodeId end, int64_t batch, MeasurementBackend& backend,
                              const RunSettings& settings) {
  return measureBlocks(model, exampleInputs, {{begin, end}}, batch, backend, settings, 1, 0).front();
}

BlockMeasurement measureBlock(const torchscript::ImportedModel& model, const ValueMap& values,
                              core::NodeId begin, core::NodeId end, MeasurementBackend& backend,
                              const RunSettings& settings) {
  return measurePrepared(model, {prepareBlock(model, values, begin, end)}, backend, settings, 1, 0)
      .front();
}

std::vector<BlockMeasurement> measureBlocks(
    const torchscript::ImportedModel& model, const std::vector<c10::IValue>& exampleInputs,
    const std::vector<std::pair<core::NodeId, core::NodeId>>& blocks, int64_t batch,
    MeasurementBackend& backend, const RunSettings& settings, int passes, double minSeconds) {
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) {
    checkBlockRange(model.graph, blocks[i].first, blocks[i].second);
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return blocks[a] < blocks[b]; });
  ForwardPrefix prefix(model, exampleInputs, batch);  // one pass serves them all, in order
  std::vector<PreparedBlock> prepared(blocks.size());
  for (size_t i : order) {
    auto [begin, end] = blocks[i];
    prepared[i] = prepareBlock(model, prefix.advanceTo(begin), begin, end);
  }
  return measurePrepared(model, prepared, backend, settings, passes, minSeconds);
}

std::vector<std::pair<core::NodeId, core::NodeId>> pickBlocks(const core::Graph& graph,
                                                              const core::GraphProfile& profile,
                                                              int64_t batch, int count,
                                                              double minSeconds, uint64_t seed) {
  std::vector<core::NodeId> starts;
  for (const core::Node& n : graph.nodes()) {
    core::ValueClass cls = graph.nodeClass(n.id);
    if (cls == core::ValueClass::Batch || cls == core::ValueClass::Loss) starts.push_back(n.id);
  }
  std::vector<std::pair<core::NodeId, core::NodeId>> blocks;
  if (starts.empty()) return blocks;
  auto isStart = [&](core::NodeId n) {
    return std::binary_search(starts.begin(), starts.end(), n);
  };
  std::mt19937_64 random(seed);
  const auto total = static_cast<core::NodeId>(graph.nodeCount());
  for (int i = 0; i < count; ++i) {
    core::NodeId begin = starts[random() % starts.size()];
    core::NodeId end = begin;
    double seconds = 0;
    auto cost = [&](core::NodeId n) {
      const core::NodeProfile& p = profile.nodes.at(n);
      return p.forwardSeconds.at(batch) + p.backwardSeconds.at(batch);
    };
    while (end < total && (seconds < minSeconds || end == begin)) seconds += cost(end++);
    // Cut short by the graph's end (a lone loss node is all overhead): grow backwards instead,
    // to the start of a BATCH/LOSS node.
    while (begin > 0 && seconds < minSeconds) seconds += cost(--begin);
    while (begin > 0 && seconds >= minSeconds && !isStart(begin)) --begin;
    blocks.emplace_back(begin, end);
  }
  return blocks;
}

CalibrationResult calibrate(const torchscript::ImportedModel& model,
                            const std::vector<c10::IValue>& exampleInputs,
                            const core::GraphProfile& profile, MeasurementBackend& backend,
                            const ProfilerOptions& options, const ValueMap* forwardValues) {
  int64_t batch = profile.batchSizes.empty() ? exampleBatchSizeOf(exampleInputs)
                                             : profile.batchSizes.back();
  core::GraphProfile raw = profile;
  raw.calibration = 1;
  CalibrationResult result;
  double predictedSum = 0, measuredSum = 0;
  auto blocks = pickBlocks(model.graph, raw, batch, options.calibrationBlocks,
                           options.calibrationMinSeconds, options.seed);
  std::sort(blocks.begin(), blocks.end());  // one forward pass serves them all, in order
  std::optional<ForwardPrefix> prefix;
  ValueMap known = forwardValues ? *forwardValues : ValueMap();
  std::vector<BlockPrediction> predictions;
  std::vector<PreparedBlock> prepared;
  for (auto [begin, end] : blocks) {
    predictions.push_back(predictBlock(model.graph, raw, range(begin, end), batch, 0));
    // The profiler's values lack those internal to a node group (e.g. a weight's transpose
    // read by a block starting at its BATCH node): computed from the parameters when that is
    // all they need, else the forward pass runs here (slow: one big function up to the block).
    bool covered = forwardValues && (covers(known, model.graph, range(begin, end)) ||
                                     (addParamDerivedInputs(model, range(begin, end), known) &&
                                      covers(known, model.graph, range(begin, end))));
    if (!covered && !prefix) prefix.emplace(model, exampleInputs, batch);
    const ValueMap& values = covered ? known : prefix->advanceTo(begin);
    prepared.push_back(prepareBlock(model, values, begin, end));
  }
  std::vector<BlockMeasurement> measurements = measurePrepared(
      model, prepared, backend,
      {options.warmupRuns, options.calibrationRepeats, options.normalizeLoad}, options.passes,
      options.passSeconds);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockPrediction& predicted = predictions[i];
    const BlockMeasurement& measured = measurements[i];
    result.samples.push_back({blocks[i].first, blocks[i].second, predicted.seconds(),
                              measured.seconds(), predicted.peakBytes, measured.peakBytes});
    predictedSum += predicted.seconds();
    measuredSum += measured.seconds();
  }
  if (result.samples.empty() || predictedSum <= 0) return result;
  result.factor = measuredSum / predictedSum;
  for (const CalibrationSample& s : result.samples) {
    result.error += relativeError(result.factor * s.predictedSeconds, s.measuredSeconds);
    result.memoryError += relativeError(static_cast<double>(s.predictedBytes),
                                        static_cast<double>(s.measuredBytes));
  }
  result.error /= static_cast<double>(result.samples.size());
  result.memoryError /= static_cast<double>(result.samples.size());
  core::logger("Profiler")->info(
      "calibrated on {} blocks at batch {}: factor {:.3f}, time error {:.1f}%, memory error "
      "{:.1f}%", result.samples.size(), batch, result.factor, 100 * result.error,
      100 * result.memoryError);
  return result;
}

}  // namespace autostage::profiler
