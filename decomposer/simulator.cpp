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
  StageEstimate estimate;
  double perMicroBatchActivation = 0;  // act(mb)
  double staticBytes = 0;
  std::vector<Operation> ops;
  size_t next = 0;
  double freeAt = 0, busy = 0, held = 0, peakDynamic = 0;
  std::vector<double> forwardDone, backwardDone;  // finish times, -1 when not yet run
};

// Runs the next operation of `s` if its dependency is done; returns whether it ran.
bool step(std::vector<StageState>& stages, int s, bool recompute) {
  StageState& st = stages[s];
  if (st.next == st.ops.size()) return false;
  const Operation op = st.ops[st.next];
  const int last = static_cast<int>(stages.size()) - 1;
  double ready = 0;
  if (op.forward && s > 0) ready = stages[s - 1].forwardDone[op.microBatch];
  if (!op.forward) ready = s < last ? stages[s + 1].backwardDone[op.microBatch] : st.forwardDone[op.microBatch];
  if (ready < 0) return false;
  const double start = std::max(st.freeAt, ready);
  const StageEstimate& e = st.estimate;
  const double kept = recompute ? e.inputBytes : st.perMicroBatchActivation;
  double duration;
  if (op.forward) {
    duration = e.forwardSeconds + e.sendForwardSeconds;
    st.held += kept;
    st.peakDynamic = std::max(st.peakDynamic, st.held);
    st.forwardDone[op.microBatch] = start + duration;
  } else {
    duration = e.backwardSeconds + e.sendBackwardSeconds;
    st.peakDynamic = std::max(st.peakDynamic, st.held + (recompute ? st.perMicroBatchActivation : 0));
    st.held -= kept;
    st.backwardDone[op.microBatch] = start + duration;
  }
  st.freeAt = start + duration;
  st.busy += duration;
  ++st.next;
  return true;
}

}  // namespace

double SimulationResult::peakMemory() const {
  return peakMemoryBytes.empty() ? 0 : *std::max_element(peakMemoryBytes.begin(), peakMemoryBytes.end());
}

SimulationResult simulatePlan(const PlanRequest& request, const Plan& plan) {
  PlanEvaluation check = evaluatePlan(request, plan);  // shape check only; memory is simulated
  AUTOSTAGE_CHECK_AS(PlanError, !check.stages.empty(), "cannot simulate plan: ", check.problem);
  CostModel model(request);
  const int count = static_cast<int>(plan.stages.size());
  const int microBatches = plan.microBatchCount;
  std::vector<StageState> stages(count);
  double maxAllreduce = 0;
  for (int s = 0; s < count; ++s) {
    const StagePlan& p = plan.stages[s];
    StageChoice choice{p.firstBlock, p.lastBlock, p.replicaCount, p.firstRank, p.recompute, count - 1 - s};
    StageState& st = stages[s];
    st.estimate = model.stage(choice, microBatches, plan.schedule);
    const double mb = static_cast<double>(st.estimate.microBatchPerReplica);
    st.perMicroBatchActivation = model.ranges().range(p.firstBlock, p.lastBlock).activationBytes.at(mb);
    const StageEstimate& e = st.estimate;
    st.staticBytes = e.paramBytes + e.gradientBytes + e.optimizerBytes + e.castCacheBytes +
                     e.workingBytes + e.commBufferBytes;
    st.ops = scheduleOrder(plan.schedule, s, count, microBatches);
    st.forwardDone.assign(microBatches, -1);
    st.backwardDone.assign(microBatches, -1);
    maxAllreduce = std::max(maxAllreduce, e.allreduceSeconds);
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < count; ++s)
      while (step(stages, s, plan.stages[s].recompute)) progress = true;
  }
  SimulationResult result;
  double busyTotal = 0;
  for (const StageState& st : stages) {
    AUTOSTAGE_INTERNAL_ASSERT(st.next == st.ops.size(), "pipeline simulation deadlocked");
    result.pipelineSeconds = std::max(result.pipelineSeconds, st.freeAt);
    result.stageBusySeconds.push_back(st.busy);
    result.peakMemoryBytes.push_back(st.staticBytes + st.peakDynamic);
    busyTotal += st.busy;
  }
  result.iterationSeconds = result.pipelineSeconds + maxAllreduce;
  result.bubbleFraction = result.pipelineSeconds > 0 ? 1 - busyTotal / (count * result.pipelineSeconds) : 0;
  return result;
}

}  // namespace autostage::decomposer
