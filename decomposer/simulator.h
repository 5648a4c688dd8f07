#pragma once
// Event-driven simulation of a plan's pipeline schedule over the shared cost model.
//
// Each stage runs its operations in schedule order (gpipe: all forwards, then all backwards;
// 1f1b: min(stages - s - 1, M) warm-up forwards, then one forward / one backward, then the
// remaining backwards). A forward of micro-batch i waits for the previous stage's forward of i
// (including its send), a backward for the next stage's backward of i. Operation times, memory
// and allreduce times come from CostModel; gradient allreduces start when the pipeline flushes.
// All replicas of a stage run the same timeline, so events are per stage.

#include <string>
#include <vector>

#include "decomposer/plan.h"

namespace autostage::decomposer {

enum class EventKind { Forward, SendForward, Backward, SendBackward, Allreduce };
std::string eventKindName(EventKind kind);  // "forward", "send_forward", ..., "allreduce"

// One operation of one stage (every replica of the stage runs it at the same time).
struct SimulationEvent {
  int stage = 0;
  EventKind kind = EventKind::Forward;
  int microBatch = -1;  // -1 for the allreduce
  double startSeconds = 0, endSeconds = 0;
};

struct SimulationResult {
  double iterationSeconds = 0;  // pipeline + the longest allreduce
  double pipelineSeconds = 0;   // first forward start to last backward end
  double bubbleFraction = 0;    // 1 - busy time / (stages * pipelineSeconds)
  std::vector<double> stageBusySeconds;
  std::vector<double> peakMemoryBytes;  // per device of each stage; empty from simulateTimeline
  std::vector<SimulationEvent> events;  // only when asked for; in execution order per stage
  double peakMemory() const;
};

// Throws PlanError when the plan's shape does not fit the request (see evaluatePlan).
// `recordEvents` fills SimulationResult::events; the other results do not depend on it.
SimulationResult simulatePlan(const PlanRequest& request, const Plan& plan, bool recordEvents = false);

// Per micro-batch times of one stage, e.g. as a deployment records them.
struct StageTiming {
  double forwardSeconds = 0, sendForwardSeconds = 0;
  double backwardSeconds = 0, sendBackwardSeconds = 0;
  double allreduceSeconds = 0;
};

// The same schedule simulation from stage times alone (no memory; peakMemoryBytes stays empty),
// with events. For stage times from a CostModel it gives simulatePlan's timeline.
SimulationResult simulateTimeline(const std::vector<StageTiming>& stages, int microBatches,
                                  Schedule schedule);

}  // namespace autostage::decomposer
