#pragma once
// The profiler's entry point: measures every node group of an imported model once per batch
// size (forward, backward, memory), fits linear costs, calibrates the composed block model on a
// few real blocks, and caches the result keyed by graph hash, device kind and dtype.
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

namespace autostage::profiler {

// Every model run of the profiler happens under options.precision's autocast (Note [Autocast
// execution] in frontend/torchscript/autocast.h).
//
// Full run: cache lookup, node profiles, calibration, cache store. The comm part of the result
// holds the configured fallbacks (see profileComm for measured ones).
core::GraphProfile profileGraph(const torchscript::ImportedModel& model,
                                const std::vector<c10::IValue>& exampleInputs,
                                MeasurementBackend& backend, const ProfilerOptions& options);

// Node profiles only (no cache, calibration 1).
core::GraphProfile profileNodes(const torchscript::ImportedModel& model,
                                const std::vector<c10::IValue>& exampleInputs,
                                MeasurementBackend& backend, const ProfilerOptions& options);

// The batch sizes profiled for an example batch of `exampleBatch` (options.batchSizes, sorted,
// or a quarter and a half of the example batch; {1, 2} below 8, {1} for a batch of 1).
std::vector<int64_t> resolveBatchSizes(const ProfilerOptions& options, int64_t exampleBatch);

// Scalar type name of the model's first floating parameter or input ("Float" if none).
std::string modelDtype(const torchscript::ImportedModel& model);
// The profile's dtype key: modelDtype, with "-autocast-bf16" (fp16) appended for mixed precision.
std::string profileDtype(const torchscript::ImportedModel& model, core::Precision precision);

// Cache file for this key ("" when options name no cache).
std::string profileCachePath(const ProfilerOptions& options, const std::string& graphHash,
                             const std::string& deviceKind, const std::string& dtype);

// Readable node name for logs: `node 12 aten::linear (fc1) -> out_name`.
std::string nodeLabel(const core::Graph& graph, core::NodeId node);

}  // namespace autostage::profiler
