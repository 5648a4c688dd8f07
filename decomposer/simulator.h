#pragma once
// Event-driven simulation of a plan's pipeline schedule over the shared cost model.
//
// Each pipeline position runs its stages' operations in the order of core::pipelineOrder (Note
// [Pipeline schedules]: gpipe, 1f1b, interleaved 1f1b; the runtime runs the same order). A forward of micro-batch i waits for the previous stage's forward of i
// (including its send), a backward for the next stage's backward of i. Operation times, memory
// and allreduce times come from CostModel; gradient allreduces start when the pipeline flushes.
// All replicas of a stage run the same timeline, so events are per stage; the stages of one
// position share its timeline and its memory.

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
  // Per device of each stage (with virtual stages: its position's peak, the same for all of the
  // position's stages); empty from simulateTimeline.
  std::vector<double> peakMemoryBytes;
  // Per stage: the activation bytes it holds at its position's memory peak (including a
  // recomputing backward's re-run activations when the peak falls there); they add up, with the
  // stages' static bytes, to the position's peak (Note [Interleaved memory]).
  std::vector<double> activationBytesAtPeak;
  std::vector<SimulationEvent> events;  // only when asked for; in execution order per stage
  double peakMemory() const;
};

// Note [Interleaved memory]
// A position's memory is the sum of its stages' static bytes (parameters, gradients, optimizer
// state, cast cache, working set and buffers: each stage's own, an upper bound where one working
// set or caller buffer would do) and the peak of the activations its order holds: replaying
// core::pipelineOrder, a forward of stage k adds the bytes stage k keeps per micro-batch, its
// backward releases them (a recomputing backward first re-creates its activations). With
// v = 1 this is the cost model's min(M, stages after + 1) held micro-batches exactly; with
// v > 1 it counts interleaving's extra in-flight chunk activations exactly for the order that
// runs. Each stage is credited the activations it holds at that peak, so the stages' totals in a
// deployment add up to the position's prediction (staging/memory_watch.h sums them).

// Throws PlanError when the plan's shape does not fit the request (see evaluatePlan).
// `recordEvents` fills SimulationResult::events; the other results do not depend on it.
SimulationResult simulatePlan(const PlanRequest& request, const Plan& plan, bool recordEvents = false);

// The simulation of stages from their estimates (evaluatePlan's, with `recomputeBytes` the
// activations a recomputing stage re-creates in backward, 0 otherwise): what simulatePlan runs.
SimulationResult simulateEstimates(const std::vector<StageEstimate>& stages,
                                   const std::vector<double>& recomputeBytes, int microBatches,
                                   Schedule schedule, int virtualStages = 1,
                                   bool recordEvents = false);

// Per micro-batch times of one stage, e.g. as a deployment records them.
struct StageTiming {
  double forwardSeconds = 0, sendForwardSeconds = 0;
  double backwardSeconds = 0, sendBackwardSeconds = 0;
  double allreduceSeconds = 0;
};

// The same schedule simulation from stage times alone (no memory; peakMemoryBytes stays empty),
// with events. For stage times from a CostModel it gives simulatePlan's timeline.
SimulationResult simulateTimeline(const std::vector<StageTiming>& stages, int microBatches,
                                  Schedule schedule, int virtualStages = 1);

}  // namespace autostage::decomposer
