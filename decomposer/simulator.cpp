// The pipeline simulator; see simulator.h.
#include "decomposer/simulator.h"

#include <algorithm>

#include "core/error.h"
#include "decomposer/cost_model.h"

namespace autostage::decomposer {
namespace {

struct Operation {
  bool forward;
  int microBatch;
};

std::vector<Operation> scheduleOrder(Schedule schedule, int stage, int stages, int microBatches) {
  std::vector<Operation> ops;
  if (schedule == Schedule::GPipe) {
    for (int i = 0; i < microBatches; ++i) ops.push_back({true, i});
    for (int i = 0; i < microBatches; ++i) ops.push_back({false, i});
    return ops;
  }
  const int warmup = std::min(stages - stage - 1, microBatches);
  for (int i = 0; i < warmup; ++i) ops.push_back({true, i});
  for (int i = 0; i < microBatches - warmup; ++i) {
    ops.push_back({true, warmup + i});
    ops.push_back({false, i});
  }
  for (int i = microBatches - warmup; i < microBatches; ++i) ops.push_back({false, i});
  return ops;
}

struct StageState {
  StageTiming timing;
  bool recompute = false;
  double kept = 0;                     // bytes held per forward until its backward
  double recomputeBytes = 0;           // extra bytes during a recomputing backward
  double staticBytes = 0;
  std::vector<Operation> ops;
  size_t next = 0;
  double freeAt = 0, busy = 0, held = 0, peakDynamic = 0;
  std::vector<double> forwardDone, backwardDone;  // finish times, -1 when not yet run
};

void addEvents(std::vector<SimulationEvent>* events, int stage, bool forward, int microBatch,
               double start, double compute, double send) {
  if (!events) return;
  const EventKind work = forward ? EventKind::Forward : EventKind::Backward;
  const EventKind transfer = forward ? EventKind::SendForward : EventKind::SendBackward;
  events->push_back({stage, work, microBatch, start, start + compute});
  if (send > 0) events->push_back({stage, transfer, microBatch, start + compute, start + compute + send});
}

// Runs the next operation of `s` if its dependency is done; returns whether it ran.
bool step(std::vector<StageState>& stages, int s, std::vector<SimulationEvent>* events) {
  StageState& st = stages[s];
  if (st.next == st.ops.size()) return false;
  const Operation op = st.ops[st.next];
  const int last = static_cast<int>(stages.size()) - 1;
  double ready = 0;
  if (op.forward && s > 0) ready = stages[s - 1].forwardDone[op.microBatch];
  if (!op.forward) ready = s < last ? stages[s + 1].backwardDone[op.microBatch] : st.forwardDone[op.microBatch];
  if (ready < 0) return false;
  const double start = std::max(st.freeAt, ready);
  const StageTiming& t = st.timing;
  double duration;
  if (op.forward) {
    duration = t.forwardSeconds + t.sendForwardSeconds;
    st.held += st.kept;
    st.peakDynamic = std::max(st.peakDynamic, st.held);
    st.forwardDone[op.microBatch] = start + duration;
    addEvents(events, s, true, op.microBatch, start, t.forwardSeconds, t.sendForwardSeconds);
  } else {
    duration = t.backwardSeconds + t.sendBackwardSeconds;
    st.peakDynamic = std::max(st.peakDynamic, st.held + st.recomputeBytes);
    st.held -= st.kept;
    st.backwardDone[op.microBatch] = start + duration;
    addEvents(events, s, false, op.microBatch, start, t.backwardSeconds, t.sendBackwardSeconds);
  }
  st.freeAt = start + duration;
  st.busy += duration;
  ++st.next;
  return true;
}

// Runs every stage's operations to completion and fills the timing results.
SimulationResult run(std::vector<StageState>& stages, int microBatches, Schedule schedule,
                     bool recordEvents) {
  const int count = static_cast<int>(stages.size());
  SimulationResult result;
  std::vector<SimulationEvent>* events = recordEvents ? &result.events : nullptr;
  double maxAllreduce = 0;
  for (int s = 0; s < count; ++s) {
    StageState& st = stages[s];
    st.ops = scheduleOrder(schedule, s, count, microBatches);
    st.forwardDone.assign(microBatches, -1);
    st.backwardDone.assign(microBatches, -1);
    maxAllreduce = std::max(maxAllreduce, st.timing.allreduceSeconds);
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < count; ++s)
      while (step(stages, s, events)) progress = true;
  }
  double busyTotal = 0;
  for (const StageState& st : stages) {
    AUTOSTAGE_INTERNAL_ASSERT(st.next == st.ops.size(), "pipeline simulation deadlocked");
    result.pipelineSeconds = std::max(result.pipelineSeconds, st.freeAt);
    result.stageBusySeconds.push_back(st.busy);
    busyTotal += st.busy;
  }
  for (int s = 0; s < count && events; ++s)
    if (stages[s].timing.allreduceSeconds > 0)
      events->push_back({s, EventKind::Allreduce, -1, result.pipelineSeconds,
                         result.pipelineSeconds + stages[s].timing.allreduceSeconds});
  result.iterationSeconds = result.pipelineSeconds + maxAllreduce;
  result.bubbleFraction = result.pipelineSeconds > 0 ? 1 - busyTotal / (count * result.pipelineSeconds) : 0;
  return result;
}

}  // namespace

std::string eventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::Forward: return "forward";
    case EventKind::SendForward: return "send_forward";
    case EventKind::Backward: return "backward";
    case EventKind::SendBackward: return "send_backward";
    case EventKind::Allreduce: return "allreduce";
  }
  return "unknown";
}

double SimulationResult::peakMemory() const {
  return peakMemoryBytes.empty() ? 0 : *std::max_element(peakMemoryBytes.begin(), peakMemoryBytes.end());
}

SimulationResult simulatePlan(const PlanRequest& request, const Plan& plan, bool recordEvents) {
  PlanEvaluation check = evaluatePlan(request, plan);  // shape check only; memory is simulated
  AUTOSTAGE_CHECK_AS(PlanError, !check.stages.empty(), "cannot simulate plan: ", check.problem);
  CostModel model(request);
  const int count = static_cast<int>(plan.stages.size());
  std::vector<StageState> stages(count);
  for (int s = 0; s < count; ++s) {
    const StagePlan& p = plan.stages[s];
    StageChoice choice{p.firstBlock, p.lastBlock, p.replicaCount, p.firstRank, p.recompute, count - 1 - s,
                       p.zero};
    const StageEstimate e = model.stage(choice, plan.microBatchCount, plan.schedule);
    StageState& st = stages[s];
    st.timing = {e.forwardSeconds, e.sendForwardSeconds, e.backwardSeconds, e.sendBackwardSeconds,
                 e.allreduceSeconds};
    const double mb = static_cast<double>(e.microBatchPerReplica);
    const double activation = model.ranges().range(p.firstBlock, p.lastBlock).activationBytes.at(mb);
    st.kept = e.bytesPerHeldMicroBatch;  // activations, the input when recomputing, or the
                                         // output for inference (Note [Plan usage])
    st.recomputeBytes = p.recompute ? activation : 0;
    st.staticBytes = e.staticMemoryBytes();
  }
  SimulationResult result = run(stages, plan.microBatchCount, plan.schedule, recordEvents);
  for (const StageState& st : stages) result.peakMemoryBytes.push_back(st.staticBytes + st.peakDynamic);
  return result;
}

SimulationResult simulateTimeline(const std::vector<StageTiming>& timings, int microBatches,
                                  Schedule schedule) {
  AUTOSTAGE_CHECK_AS(PlanError, !timings.empty() && microBatches >= 1,
                     "cannot simulate a timeline of ", timings.size(), " stages and ", microBatches,
                     " micro-batches; expected at least one of each");
  std::vector<StageState> stages(timings.size());
  for (size_t s = 0; s < timings.size(); ++s) stages[s].timing = timings[s];
  return run(stages, microBatches, schedule, true);
}

}  // namespace autostage::decomposer
