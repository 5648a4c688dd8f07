#pragma once
// The times of tensor-parallel patterns on one member of a group (core::SplitTimes), measured on
// that member's graph and parameter slices.
//
// Note [Tensor-parallel profile]
// A pattern split t ways (Note [Tensor-parallel stages] in staging/tensor_parallel.h) runs on
// each member a linear of 1/t of the columns or rows, 1/t of the heads, 1/t of the vocabulary. Its
// time is not the whole time / t: a matmul of fewer columns uses the cores less well, and a fixed
// per-call cost does not shrink at all. So when a job allows tensor parallelism (the option
// tensor_parallel is not 1), the profiler measures, for each degree t the planner may choose and
// some pattern splits at, the rewrite's member graph at t (the driver makes it: member 0 of a
// group of one rank standing for t, whose collectives are no-ops, so only compute is timed; the
// all-reduces are costed from the comm profile) with member 0's parameter slices. It runs that
// graph forward as the whole profile runs the model's, and measures the node groups of the split
// patterns' nodes alone, as every node group is measured (Note [Measurement passes] in
// node_runner.h). Each figure goes to the original node's NodeProfile::split. The planner
// (decomposer/tensor_parallel_patterns.cpp, addShardableSpans) takes a pattern's time on a member
// at t from these, calibrated as the whole ones are and never more than the whole; a node without
// one counts its whole time / t. The degrees measured are part of the profile key
// (ProfilerOptions::splitDegrees), so a profile made without them is not reused for such a job.

#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/profile.h"
#include "frontend/torchscript/importer.h"
#include "profiler/measurement_backend.h"
#include "profiler/profiler_options.h"

namespace autostage::profiler {

// One member's model at a degree (Note [Tensor-parallel profile]).
struct SplitModel {
  torchscript::ImportedModel model;    // the member's graph and its parameter slices
  std::vector<core::ValueId> inputs;   // per input of model.graph: the original value it stands for
  std::vector<core::NodeId> origin;    // per node of model.graph: the original node (or kNoNode)
  std::vector<core::NodeId> measured;  // nodes of model.graph whose groups are measured
  std::shared_ptr<void> context;       // what its operators need while it runs
};
// The member's model at `degree`; nullopt when no pattern splits at it.
using SplitModelMaker = std::function<std::optional<SplitModel>(int degree)>;

// For each of options.splitDegrees, measures `make(degree)`'s node groups and adds their times to
// profile.nodes (SplitTimes of that degree, on the original nodes). A degree whose model cannot
// be made or run is logged and left out (the planner then divides by it).
void addSplitTimes(const torchscript::ImportedModel& model,
                   const std::vector<c10::IValue>& exampleInputs, MeasurementBackend& backend,
                   const ProfilerOptions& options, const SplitModelMaker& make,
                   core::GraphProfile& profile);

}  // namespace autostage::profiler
