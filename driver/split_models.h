#pragma once
// The member models on which the profiler measures tensor-parallel patterns (Note
// [Tensor-parallel profile] in profiler/split_profile.h): the rewrite of staging/tensor_parallel.h
// applied to the whole graph, run as member 0 of a one-rank group.

#include <optional>
#include <vector>

#include "decomposer/plan.h"
#include "frontend/torchscript/importer.h"
#include "profiler/split_profile.h"

namespace autostage::driver {

// The degrees above 1 the planner may choose for this job (options.tensor_parallel on nodes of
// `devicesPerNode` ranks, at most `worldSize`) at which some pattern of `graph` splits: those the
// profiler measures.
std::vector<int> splitProfileDegrees(const core::Graph& graph,
                                     const decomposer::PlanOptions& options, int devicesPerNode,
                                     int worldSize);

// Member 0's model of `model` at `degree`: the sharded graph of every node, member 0's parameter
// slices (leaves requiring grad where the parameter does), the nodes of the patterns split to
// measure, and the one-rank group its operators use. nullopt when no pattern splits at `degree`.
std::optional<profiler::SplitModel> memberModel(const torchscript::ImportedModel& model,
                                                int degree);

}  // namespace autostage::driver
