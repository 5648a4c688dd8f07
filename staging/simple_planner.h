#pragma once
// A stand-in planner for examples and smoke runs until the real profiler + decomposer are wired
// into ModuleOptions::planner: `stageCount` stages of consecutive nodes (equal node counts, so
// each stage is convex), each replicated worldSize / stageCount times on consecutive ranks, with
// the routes derived from the graph (Note [Routes]). Not cost-aware.

#include <string>

#include "core/deployment.h"
#include "core/ir/graph.h"
#include "staging/module.h"

namespace autostage::staging {

struct UniformPlanOptions {
  int stageCount = 1;
  int microBatchCount = 1;
  std::string schedule = "gpipe";
  bool recompute = false;
  // Throws ConfigError unless stageCount >= 1, microBatchCount >= 1, schedule is gpipe or 1f1b.
  void validate() const;
  std::string toString() const;
};

// Throws ConfigError when worldSize is not a multiple of stageCount or the graph has fewer
// nodes than stages.
core::Deployment uniformPlan(const core::Graph& graph, int worldSize, int64_t batchSize,
                             const UniformPlanOptions& options);

// uniformPlan as a ModuleOptions::planner.
PlanningCallback uniformPlanner(UniformPlanOptions options);

}  // namespace autostage::staging
