#pragma once
// Running exported node subsets for measurement: value environments filled by a real forward
// pass, batch resizing, and the one function through which the profiler executes model code
// (executeFunction), whose call counter proves that a cached run executes nothing.

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/ivalue.h>

#include "frontend/torchscript/exporter.h"
#include "frontend/torchscript/importer.h"
#include "profiler/measurement_backend.h"

namespace autostage::profiler {

using ValueMap = std::unordered_map<core::ValueId, c10::IValue>;

// The only way the profiler runs model code. Counts every call.
std::vector<c10::IValue> executeFunction(const torchscript::ExportedFunction& function,
                                         std::vector<c10::IValue> args);
// Calls of executeFunction since the process started.
int64_t executionCount();

// Tensor (or tuple/list of tensors) with dim 0 resized to `batch`: narrowed when smaller,
// repeated cyclically when larger. Other values are returned unchanged.
c10::IValue resizeBatch(const c10::IValue& value, int64_t fromBatch, int64_t batch);

// Dim 0 of the first tensor (inside tuples/lists too) with at least one dimension; 1 if none.
int64_t exampleBatchSizeOf(const std::vector<c10::IValue>& inputs);

// Graph inputs: example inputs resized to `batch` (BATCH inputs) and the model's parameter
// tensors (PARAM inputs, shared, not copied).
ValueMap seedValues(const torchscript::ImportedModel& model,
                    const std::vector<c10::IValue>& exampleInputs, int64_t batch);

// Arguments of `function` from `values`; throws Error naming the first missing value.
std::vector<c10::IValue> gatherArgs(const core::Graph& graph,
                                    const torchscript::ExportedFunction& function,
                                    const ValueMap& values);

// "name: Float(8, 16), ..." of the function's inputs, for failure reports.
std::string describeInputs(const core::Graph& graph, const std::vector<c10::IValue>& args,
                           const std::vector<core::ValueId>& ids);

// Times of individual timed runs (seconds), in the order they ran.
struct TimedRuns {
  std::vector<double> forward, backward;
};

// Measured costs of one training step (forward with autograd recording, then backward with
// all-ones output gradients) of an exported subset. Memory figures are relative to the usage
// before the run (model parameters and the value environment excluded) and leave out the
// input copies (inputBytes), which a pipeline stage holds anyway.
struct RunMeasurement {
  // The smallest median of a pass's timed runs (Note [Measurement passes]).
  double forwardSeconds = 0;
  double backwardSeconds = 0;  // 0 when no output needs a gradient
  TimedRuns passMedians;       // per pass: the median of its timed runs
  int64_t inputBytes = 0;      // floating non-BATCH inputs (fed as grad-requiring copies)
  int64_t outputBytes = 0;     // distinct storages of the outputs
  int64_t keptBytes = 0;       // held after forward: outputs + tensors saved for backward
  int64_t gradientBytes = 0;   // parameter gradients created by backward
  int64_t inputGradBytes = 0;  // gradients of the floating non-BATCH inputs
  int64_t outputGradBytes = 0;  // the all-ones gradients fed to the outputs
  int64_t peakBytes = 0;       // peak during forward + backward (includes the above)
  int64_t activationBytes() const { return std::max<int64_t>(0, keptBytes - outputBytes); }
  // Temporaries beyond what Note [Block composition] (cost_model.h) charges a block anyway:
  // kept bytes, parameter gradients and the gradients of its boundary inputs and outputs.
  int64_t workingBytes() const {
    return std::max<int64_t>(
        0, peakBytes - keptBytes - gradientBytes - inputGradBytes - outputGradBytes);
  }
  // Adds the timed runs of one pass (Note [Measurement passes]).
  void addPass(const TimedRuns& pass);
};

// Where profiling time goes (wall seconds), accumulated across runs when a RunSettings points
// at one; the profiler logs it as a breakdown.
struct PhaseTimes {
  double memoryRuns = 0;  // the first (untimed, memory-recording) run of each measurement
  double timedRuns = 0;   // warm-ups after the first and the timed runs, with their set-up
  double loadProbes = 0;  // reference-kernel timings (Note [Load normalization])
  int64_t measurements = 0;
};

struct RunSettings {
  int warmupRuns = 1;  // >= 1: the first run records memory and is never timed
  int repeats = 5;     // timed runs of one measurement (one pass)
  bool normalizeLoad = false;  // see Note [Load normalization] in node_runner.cpp
  PhaseTimes* phases = nullptr;  // optional: accumulates where the time went
};

// Inputs that are PARAM graph inputs are fed as the model's own tensors (gradients are reset
// to undefined around each run); other tensors are fed as detached clones, floating ones
// (except BATCH graph inputs) requiring grad, as they would inside a pipeline stage.
RunMeasurement measureRun(const core::Graph& graph, const torchscript::ExportedFunction& function,
                          const std::vector<c10::IValue>& args, MeasurementBackend& backend,
                          const RunSettings& settings,
                          std::vector<c10::IValue>* outputs = nullptr);

// Note [Measurement passes]
// On a machine that shares its memory system (a VM on a busy host, other jobs on the other core)
// the same kernel's speed drifts. Measured here on an otherwise idle machine, in process CPU
// time: a 64x512x512 matmul took 5.7-10 ms per 250 ms window, slow stretches lasting up to a
// second, while a register-only loop stayed within 4% (so it is contention for caches and
// memory, not lost CPU time). Runs taken back to back all land in one stretch: the same block,
// measured as the median of 9 runs a few seconds apart, took 12.2, 12.4, 13.9 and 17.0 ms.
// So every figure is measured in passes spread over time: the profiler passes through the whole
// model profile_passes times, timing each node group profile_repeats times per pass, and
// calibration and measureBlocks pass over their blocks the same way. Each pass keeps the median
// of its runs; the figure is the smallest pass median. Contention only ever adds time, so the
// least disturbed pass is the best estimate of the code's own cost, and it is the same estimate
// for a node, for a block built from nodes, and for the reference a test measures (the
// reasoning behind timeit's advice to take the minimum of repeated measurements).
//
// settings.repeats more timed runs (forward with autograd, then backward) of an exported subset,
// without warm-up or memory figures: a later pass of measureRun's measurement, for
// RunMeasurement::addPass.
TimedRuns timeRuns(const core::Graph& graph, const torchscript::ExportedFunction& function,
                   const std::vector<c10::IValue>& args, MeasurementBackend& backend,
                   const RunSettings& settings);

// Whether a measurement that began at `started` (wallSeconds) after `done` passes takes another
// (Note [Measurement passes]): until `passes` passes spanning `minSeconds`, at most kMaxPasses.
bool wantsAnotherPass(int done, int passes, double started, double minSeconds);

// Seconds on the steady clock (for wall-time breakdowns, not for measurements).
double wallSeconds();


}  // namespace autostage::profiler
