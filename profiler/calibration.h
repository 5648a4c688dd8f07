#pragma once
// Measuring real multi-node blocks and fitting the composed model's correction factor.
//
// measureBlock runs a contiguous node range [begin, end) as one exported function, with inputs
// from a real forward pass of the nodes before it, and reports forward/backward time and peak
// memory measured the way predictBlock (cost_model.h) predicts them with optParamFactor 0:
// parameters + stage inputs + peak of forward and backward.

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>

#include "core/profile.h"
#include "frontend/torchscript/importer.h"
#include "profiler/measurement_backend.h"
#include "profiler/node_runner.h"
#include "profiler/profiler_options.h"

namespace autostage::profiler {

struct BlockMeasurement {
  double forwardSeconds = 0;
  double backwardSeconds = 0;
  int64_t peakBytes = 0;
  double seconds() const { return forwardSeconds + backwardSeconds; }
};

BlockMeasurement measureBlock(const torchscript::ImportedModel& model,
                              const std::vector<c10::IValue>& exampleInputs, core::NodeId begin,
                              core::NodeId end, int64_t batch, MeasurementBackend& backend,
                              const RunSettings& settings);

// The same, with `values` holding (at least) every value the block reads, from a real forward
// pass at `batch` (see ForwardPrefix).
BlockMeasurement measureBlock(const torchscript::ImportedModel& model, const ValueMap& values,
                              core::NodeId begin, core::NodeId end, MeasurementBackend& backend,
                              const RunSettings& settings);

// Several blocks, measured together: their timed runs are spread over at least `passes` passes
// through all of them, spanning at least `minSeconds` (Note [Measurement passes] in
// node_runner.h), each pass running settings.repeats timed runs of every block. Results in the
// order of `blocks`.
std::vector<BlockMeasurement> measureBlocks(
    const torchscript::ImportedModel& model, const std::vector<c10::IValue>& exampleInputs,
    const std::vector<std::pair<core::NodeId, core::NodeId>>& blocks, int64_t batch,
    MeasurementBackend& backend, const RunSettings& settings, int passes, double minSeconds);

// Values of one real forward pass (no autograd) at `batch`, advanced in node order: several
// blocks share one pass instead of re-running the model up to each of them.
class ForwardPrefix {
 public:
  ForwardPrefix(const torchscript::ImportedModel& model,
                const std::vector<c10::IValue>& exampleInputs, int64_t batch);
  // Runs nodes [position, end) (nothing when end <= position); returns every value so far.
  const ValueMap& advanceTo(core::NodeId end);

 private:
  const torchscript::ImportedModel& model_;
  ValueMap values_;
  core::NodeId position_ = 0;
};

// `count` random contiguous ranges [begin, end), each starting at a BATCH/LOSS node and grown
// until its uncalibrated predicted time reaches `minSeconds`; one that reaches the graph's end
// first grows backwards instead (to a BATCH/LOSS node's start).
std::vector<std::pair<core::NodeId, core::NodeId>> pickBlocks(const core::Graph& graph,
                                                              const core::GraphProfile& profile,
                                                              int64_t batch, int count,
                                                              double minSeconds, uint64_t seed);

struct CalibrationSample {
  core::NodeId begin = 0, end = 0;
  double predictedSeconds = 0;  // uncalibrated
  double measuredSeconds = 0;
  int64_t predictedBytes = 0;
  int64_t measuredBytes = 0;
};

struct CalibrationResult {
  double factor = 1;  // sum measured / sum predicted time
  double error = 0;   // mean relative error of the calibrated time predictions
  double memoryError = 0;  // mean relative error of the peak memory predictions
  std::vector<CalibrationSample> samples;
};

// Measures options.calibrationBlocks blocks at the largest profiled batch size; logs the result.
// `forwardValues`, when given, holds every value of a real forward pass at that batch size (the
// profiler's last pass); otherwise one forward pass is run here.
CalibrationResult calibrate(const torchscript::ImportedModel& model,
                            const std::vector<c10::IValue>& exampleInputs,
                            const core::GraphProfile& profile, MeasurementBackend& backend,
                            const ProfilerOptions& options,
                            const ValueMap* forwardValues = nullptr);

}  // namespace autostage::profiler
