#pragma once
// Event-driven simulation of a plan's pipeline schedule over the shared cost model.
//
// Each stage runs its operations in schedule order (gpipe: all forwards, then all backwards;
// 1f1b: min(stages - s - 1, M) warm-up forwards, then one forward / one backward, then the
// remaining backwards). A forward of micro-batch i waits for the previous stage's forward of i
// (including its send), a backward for the next stage's backward of i. Operation times, memory
// and allreduce times come from CostModel; gradient allreduces start when the pipeline flushes.

#include <vector>

#include "decomposer/plan.h"

namespace autostage::decomposer {

struct SimulationResult {
  double iterationSeconds = 0;  // pipeline + the longest allreduce
  double pipelineSeconds = 0;   // first forward start to last backward end
  double bubbleFraction = 0;    // 1 - busy time / (stages * pipelineSeconds)
  std::vector<double> stageBusySeconds;
  std::vector<double> peakMemoryBytes;  // per device of each stage
  double peakMemory() const;
};

// Throws PlanError when the plan's shape does not fit the request (see evaluatePlan).
SimulationResult simulatePlan(const PlanRequest& request, const Plan& plan);

}  // namespace autostage::decomposer
