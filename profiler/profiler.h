#pragma once
// The profiler's entry point: measures every node group of an imported model once per batch
// size (forward, backward, memory), fits linear costs, calibrates the composed block model on a
// few real blocks, and caches the result under its profile key (Note [Profile key]).
//
// Inputs of each node come from one real forward pass of the whole model per batch size
// (example inputs narrowed or repeated along dim 0). A node that fails is logged by name with
// its input shapes and recorded in its NodeProfile (failure, maxBatch); the run continues.

#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "core/profile.h"
#include "frontend/torchscript/importer.h"
#include "profiler/measurement_backend.h"
#include "profiler/profiler_options.h"
#include "profiler/split_profile.h"

namespace autostage::profiler {

// Every model run of the profiler happens under options.precision's autocast (Note [Autocast
// execution] in frontend/torchscript/autocast.h).
//
// Full run: cache lookup, node profiles, calibration, cache store. The comm part of the result
// holds the configured fallbacks (see profileComm for measured ones).
// With options.splitDegrees, `split` makes the member models whose times it adds (Note
// [Tensor-parallel profile] in split_profile.h).
core::GraphProfile profileGraph(const torchscript::ImportedModel& model,
                                const std::vector<c10::IValue>& exampleInputs,
                                MeasurementBackend& backend, const ProfilerOptions& options,
                                const SplitModelMaker& split = {});

// Node profiles only (no cache, calibration 1); with `only`, of the groups keyed by those nodes
// (the other nodes run for their values).
core::GraphProfile profileNodes(const torchscript::ImportedModel& model,
                                const std::vector<c10::IValue>& exampleInputs,
                                MeasurementBackend& backend, const ProfilerOptions& options,
                                const std::vector<core::NodeId>* only = nullptr);

// The batch sizes profiled for an example batch of `exampleBatch` (options.batchSizes, sorted,
// or a quarter and a half of the example batch; {1, 2} below 8, {1} for a batch of 1).
std::vector<int64_t> resolveBatchSizes(const ProfilerOptions& options, int64_t exampleBatch);

// Scalar type name of the model's first floating parameter or input ("Float" if none).
std::string modelDtype(const torchscript::ImportedModel& model);
// The profile's dtype key: modelDtype, with "-autocast-bf16" (fp16) appended for mixed precision.
std::string profileDtype(const torchscript::ImportedModel& model, core::Precision precision);

// Note [Profile key]
// What a profile depends on, named once for every place that keeps or asks for one (the
// profile cache here, a job's own profile between its plans, the planning service's stored
// profiles): the graph's hash (the model and its shapes but the batch), the batch sizes it is
// measured at (resolveBatchSizes: the batch counts through them, and only through them, since
// calibration measures at the largest), the options that change a measurement
// (ProfilerOptions::measurementText), the device kind (the GPU's model on CUDA) and the dtype
// (profileDtype).
struct ProfileKey {
  std::string graphHash, deviceKind, dtype;
  std::string text;  // all of the above, one per line
};
ProfileKey profileKey(const torchscript::ImportedModel& model,
                      const std::vector<c10::IValue>& exampleInputs,
                      const ProfilerOptions& options, const std::string& deviceKind);

// The cache file of this key ("" when options name no cache): cacheFile, or a file in cacheDir
// named by the graph hash, device kind, dtype and a hash of the whole key.
std::string profileCachePath(const ProfilerOptions& options, const ProfileKey& key);

using core::nodeLabel;  // core/ir/graph.h

}  // namespace autostage::profiler
