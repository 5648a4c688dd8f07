// The pipeline simulator; see simulator.h.
#include "decomposer/simulator.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"
#include "core/pipeline_schedule.h"
#include "decomposer/cost_model.h"

namespace autostage::decomposer {
namespace {

// One stage's times, memory terms and completion times.
struct StageState {
  StageTiming timing;
  double kept = 0;            // bytes held per forward until its backward
  double recomputeBytes = 0;  // extra bytes during a recomputing backward
  double staticBytes = 0;
  double busy = 0;
  std::vector<double> forwardDone, backwardDone;  // finish times, -1 when not yet run
};

// One pipeline position: the ranks running stages position, position + S, ... in the order of
// core::pipelineOrder (Note [Pipeline schedules]); its operations share one timeline and one
// memory.
struct Lane {
  const std::vector<core::PipelineOp>* ops = nullptr;  // orderOf's, valid for this simulation
  size_t next = 0;
  double freeAt = 0, busy = 0, held = 0, peakDynamic = 0;
  std::vector<double> heldBy, peakBy;  // per chunk: bytes held now, and at the peak
};

void addEvents(std::vector<SimulationEvent>* events, int stage, bool forward, int microBatch,
               double start, double compute, double send) {
  if (!events) return;
  const EventKind work = forward ? EventKind::Forward : EventKind::Backward;
  const EventKind transfer = forward ? EventKind::SendForward : EventKind::SendBackward;
  events->push_back({stage, work, microBatch, start, start + compute});
  if (send > 0) events->push_back({stage, transfer, microBatch, start + compute, start + compute + send});
}

// Runs lane `p`'s next operation if its dependency is done; returns whether it ran.
bool step(std::vector<StageState>& stages, std::vector<Lane>& lanes, int p,
          std::vector<SimulationEvent>* events) {
  Lane& lane = lanes[p];
  if (lane.next == lane.ops->size()) return false;
  const core::PipelineOp op = (*lane.ops)[lane.next];
  const int s = op.chunk * static_cast<int>(lanes.size()) + p;
  const int last = static_cast<int>(stages.size()) - 1;
  StageState& st = stages[s];
  double ready = 0;
  if (op.forward && s > 0) ready = stages[s - 1].forwardDone[op.microBatch];
  if (!op.forward) ready = s < last ? stages[s + 1].backwardDone[op.microBatch] : st.forwardDone[op.microBatch];
  if (ready < 0) return false;
  const double start = std::max(lane.freeAt, ready);
  const StageTiming& t = st.timing;
  double duration;
  if (op.forward) {
    duration = t.forwardSeconds + t.sendForwardSeconds;
    lane.held += st.kept;
    lane.heldBy[op.chunk] += st.kept;
    if (lane.held > lane.peakDynamic) lane.peakDynamic = lane.held, lane.peakBy = lane.heldBy;
    st.forwardDone[op.microBatch] = start + duration;
    addEvents(events, s, true, op.microBatch, start, t.forwardSeconds, t.sendForwardSeconds);
  } else {
    duration = t.backwardSeconds + t.sendBackwardSeconds;
    if (lane.held + st.recomputeBytes > lane.peakDynamic) {
      lane.peakDynamic = lane.held + st.recomputeBytes;
      lane.peakBy = lane.heldBy;
      lane.peakBy[op.chunk] += st.recomputeBytes;
    }
    lane.held -= st.kept;
    lane.heldBy[op.chunk] -= st.kept;
    st.backwardDone[op.microBatch] = start + duration;
    addEvents(events, s, false, op.microBatch, start, t.backwardSeconds, t.sendBackwardSeconds);
  }
  lane.freeAt = start + duration;
  lane.busy += duration;
  st.busy += duration;
  ++lane.next;
  return true;
}

// core::pipelineOrder, remembered per thread: a planner simulates thousands of plans of a few
// shapes (Note [Simulated refinement]). References stay valid until the memo is cleared, which
// run() does only before a simulation starts, when it holds more than kOrderMemoSize orders.
using OrderKey = std::tuple<Schedule, int, int, int, int>;
std::map<OrderKey, std::vector<core::PipelineOp>>& orderMemo() {
  thread_local std::map<OrderKey, std::vector<core::PipelineOp>> memo;
  return memo;
}
constexpr size_t kOrderMemoSize = 4096;

const std::vector<core::PipelineOp>& orderOf(Schedule schedule, int position, int positions,
                                             int virtualStages, int microBatches) {
  auto& memo = orderMemo();
  const OrderKey key{schedule, position, positions, virtualStages, microBatches};
  auto found = memo.find(key);
  if (found != memo.end()) return found->second;
  return memo
      .emplace(key, core::pipelineOrder(scheduleName(schedule), position, positions, virtualStages,
                                        microBatches))
      .first->second;
}

// Runs every position's operations to completion and fills the timing results; the lanes are
// left with their memory peaks. A position's gradient allreduce covers all its stages (one
// holder set, Note [Gradient scaling] in staging/gradient_sync.h): their times add up.
SimulationResult run(std::vector<StageState>& stages, std::vector<Lane>& lanes, int microBatches,
                     Schedule schedule, int virtualStages, bool recordEvents) {
  const int count = static_cast<int>(stages.size());
  AUTOSTAGE_CHECK_AS(PlanError, virtualStages >= 1 && count % virtualStages == 0,
                     "cannot simulate ", count, " stages as ", virtualStages,
                     " virtual stages per position");
  const int positions = count / virtualStages;
  SimulationResult result;
  std::vector<SimulationEvent>* events = recordEvents ? &result.events : nullptr;
  lanes.assign(positions, Lane{});
  if (orderMemo().size() > kOrderMemoSize) orderMemo().clear();
  for (int p = 0; p < positions; ++p) {
    lanes[p].heldBy.assign(virtualStages, 0.0);
    lanes[p].peakBy.assign(virtualStages, 0.0);
    lanes[p].ops = &orderOf(schedule, p, positions, virtualStages, microBatches);
  }
  std::vector<double> allreduce(positions, 0.0);
  for (int s = 0; s < count; ++s) {
    stages[s].forwardDone.assign(microBatches, -1);
    stages[s].backwardDone.assign(microBatches, -1);
    allreduce[s % positions] += stages[s].timing.allreduceSeconds;
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int p = 0; p < positions; ++p)
      while (step(stages, lanes, p, events)) progress = true;
  }
  double busyTotal = 0;
  for (const Lane& lane : lanes) {
    AUTOSTAGE_INTERNAL_ASSERT(lane.next == lane.ops->size(), "pipeline simulation deadlocked");
    result.pipelineSeconds = std::max(result.pipelineSeconds, lane.freeAt);
    busyTotal += lane.busy;
  }
  for (const StageState& st : stages) result.stageBusySeconds.push_back(st.busy);
  for (int s = 0; s < count && events; ++s)
    if (stages[s].timing.allreduceSeconds > 0)
      events->push_back({s, EventKind::Allreduce, -1, result.pipelineSeconds,
                         result.pipelineSeconds + stages[s].timing.allreduceSeconds});
  result.iterationSeconds =
      result.pipelineSeconds + *std::max_element(allreduce.begin(), allreduce.end());
  result.bubbleFraction = result.pipelineSeconds > 0 ? 1 - busyTotal / (positions * result.pipelineSeconds) : 0;
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

SimulationResult simulateEstimates(const std::vector<StageEstimate>& estimates,
                                   const std::vector<double>& recomputeBytes, int microBatches,
                                   Schedule schedule, int virtualStages, bool recordEvents) {
  const int count = static_cast<int>(estimates.size());
  AUTOSTAGE_INTERNAL_ASSERT(recomputeBytes.size() == estimates.size(), "one recompute size per stage");
  std::vector<StageState> stages(count);
  for (int s = 0; s < count; ++s) {
    const StageEstimate& e = estimates[s];
    StageState& st = stages[s];
    st.timing = {e.forwardSeconds, e.sendForwardSeconds, e.backwardSeconds, e.sendBackwardSeconds,
                 e.allreduceSeconds};
    st.kept = e.bytesPerHeldMicroBatch;  // activations, the input when recomputing, or the
                                         // output for inference (Note [Plan usage])
    st.recomputeBytes = recomputeBytes[s];
    st.staticBytes = e.staticMemoryBytes();
  }
  std::vector<Lane> lanes;
  SimulationResult result = run(stages, lanes, microBatches, schedule, virtualStages, recordEvents);
  const int positions = static_cast<int>(lanes.size());
  std::vector<double> laneStatic(positions, 0.0);
  for (int s = 0; s < count; ++s) laneStatic[s % positions] += stages[s].staticBytes;
  for (int s = 0; s < count; ++s) {  // per device of each stage: its position's peak
    const Lane& lane = lanes[s % positions];
    result.peakMemoryBytes.push_back(laneStatic[s % positions] + lane.peakDynamic);
    result.activationBytesAtPeak.push_back(lane.peakBy[s / positions]);
  }
  return result;
}

SimulationResult simulatePlan(const PlanRequest& request, const Plan& plan, bool recordEvents) {
  PlanEvaluation check = evaluatePlan(request, plan);  // shape check only; memory is simulated
  AUTOSTAGE_CHECK_AS(PlanError, !check.stages.empty(), "cannot simulate plan: ", check.problem);
  const CostModel model(request);
  std::vector<double> recomputeBytes;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& p = plan.stages[s];
    const double mb = static_cast<double>(check.stages[s].microBatchPerReplica);
    recomputeBytes.push_back(
        p.recompute ? model.ranges().range(p.firstBlock, p.lastBlock).activationBytes.at(mb) : 0);
  }
  return simulateEstimates(check.stages, recomputeBytes, plan.microBatchCount, plan.schedule,
                           plan.virtualStages, recordEvents);
}

SimulationResult simulateTimeline(const std::vector<StageTiming>& timings, int microBatches,
                                  Schedule schedule, int virtualStages) {
  AUTOSTAGE_CHECK_AS(PlanError, !timings.empty() && microBatches >= 1,
                     "cannot simulate a timeline of ", timings.size(), " stages and ", microBatches,
                     " micro-batches; expected at least one of each");
  std::vector<StageState> stages(timings.size());
  for (size_t s = 0; s < timings.size(); ++s) stages[s].timing = timings[s];
  std::vector<Lane> lanes;
  return run(stages, lanes, microBatches, schedule, virtualStages, true);
}

}  // namespace autostage::decomposer
