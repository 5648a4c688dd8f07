// evaluatePlan: checks a plan's shape and recomputes its cost from the cost model, stage by stage,
// without any of the planner's search state (the tests compare the two).
#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/pipeline_schedule.h"
#include "decomposer/cost_model.h"
#include "decomposer/pipeline_time.h"
#include "decomposer/plan.h"
#include "decomposer/simulator.h"

namespace autostage::decomposer {
namespace {

// A message stream made on first use: planners evaluate many plans, and a stream costs its
// locale, while most plans have no problem to describe.
class LazyMessage {
 public:
  std::ostringstream& operator()() { return stream_ ? *stream_ : stream_.emplace(); }
  std::string str() const { return stream_ ? stream_->str() : ""; }

 private:
  std::optional<std::ostringstream> stream_;
};

// Note [Tensor-parallel cost] (cost_model.h): a replica's t ranks on one node, which the
// stage's first rank being a multiple of t (dividing the devices per node) ensures. Empty when
// the stage's degree is one the cost model prices. `allowed` caches the degrees the options
// allow, asked for only where a stage has one above 1 (evaluation runs this per plan candidate).
std::string tensorParallelProblem(const PlanRequest& request, const StagePlan& st,
                                  std::optional<std::vector<int>>& allowed) {
  const int t = st.tensorParallel;
  if (t == 1) return "";
  if (!allowed) allowed = request.options.tensorParallelCandidates(request.devicesPerNode);
  if (std::find(allowed->begin(), allowed->end(), t) == allowed->end())
    return "tensor_parallel=" + std::to_string(t) + " is not allowed by option tensor_parallel=" +
           request.options.tensorParallel + " with " + std::to_string(request.devicesPerNode) +
           " devices per node";
  if (request.devicesPerNode % t != 0 || st.firstRank % t != 0)
    return "tensor_parallel=" + std::to_string(t) + " needs each replica's " + std::to_string(t) +
           " ranks on one node (first rank " + std::to_string(st.firstRank) + ", " +
           std::to_string(request.devicesPerNode) + " devices per node)";
  return "";
}

// Empty when the plan is well formed for the request; otherwise what is wrong.
std::string shapeProblem(const PlanRequest& request, const Plan& plan) {
  LazyMessage out;
  const int n = static_cast<int>(request.blocks.size());
  if (plan.stages.empty()) return "plan has no stages";
  if (plan.microBatchCount < 1) return "micro-batch count must be >= 1";
  const int v = plan.virtualStages;
  if (v < 1 || plan.stages.size() % v != 0)
    return std::to_string(plan.stages.size()) + " stages cannot be " + std::to_string(v) +
           " virtual stages per position";
  const size_t positions = plan.stages.size() / v;
  if (v > 1) {
    std::string problem = core::pipelineShapeProblem(scheduleName(plan.schedule),
                                                     static_cast<int>(positions), v,
                                                     plan.microBatchCount);
    if (!problem.empty()) return problem;
  }
  int nextBlock = 0, nextRank = plan.stages.front().firstRank;
  std::optional<std::vector<int>> allowedDegrees;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& st = plan.stages[s];
    if (st.firstBlock != nextBlock || st.lastBlock < st.firstBlock) {
      out() << "stage " << s << " covers blocks " << st.firstBlock << ".." << st.lastBlock
          << " but must start at block " << nextBlock;
      return out().str();
    }
    nextBlock = st.lastBlock + 1;
    if (s >= positions) {  // a later virtual stage: on its position's ranks
      const StagePlan& home = plan.stages[s % positions];
      if (st.firstRank != home.firstRank || st.replicaCount != home.replicaCount ||
          st.tensorParallel != home.tensorParallel) {
        out() << "stage " << s << " must run on the ranks of stage " << s % positions
            << " (virtual stage " << s / positions << " of that position)";
        return out().str();
      }
      continue;
    }
    if (st.replicaCount < 1 || st.firstRank != nextRank) {
      out() << "stage " << s << " must have >= 1 replica starting at rank " << nextRank;
      return out().str();
    }
    std::string tensorParallel = tensorParallelProblem(request, st, allowedDegrees);
    if (!tensorParallel.empty()) return "stage " + std::to_string(s) + ": " + tensorParallel;
    if (static_cast<int64_t>(plan.microBatchCount) * st.replicaCount > request.batchSize) {
      out() << "stage " << s << ": " << plan.microBatchCount << " micro-batches x "
          << st.replicaCount << " replicas exceed the batch " << request.batchSize;
      return out().str();
    }
    const int64_t rows = request.options.microBatchSize;  // Note [Fixed micro-batch size]
    if (rows > 0 && rows * plan.microBatchCount * st.replicaCount != request.batchSize) {
      out() << "stage " << s << ": micro_batch_size=" << rows << " needs the batch "
          << request.batchSize << " to be " << rows << " rows x " << plan.microBatchCount
          << " micro-batches x " << st.replicaCount << " replicas";
      return out().str();
    }
    nextRank = st.firstRank + st.rankCount();
  }
  if (nextBlock != n) return "stages cover " + std::to_string(nextBlock) + " of " + std::to_string(n) + " blocks";
  if (plan.stages.front().firstRank < 0 || nextRank > request.devices)
    return "stages use ranks beyond 0.." + std::to_string(request.devices - 1);
  return "";
}

}  // namespace

PlanEvaluation evaluatePlan(const PlanRequest& request, const Plan& plan) {
  CostModel model(request);
  return evaluatePlanWith(model, plan);
}

namespace {

// Note [Interleaved evaluation]
// With virtual stages the closed form of Note [Pipeline cost model] does not describe the order
// that runs, so an interleaved plan's times and memory both come from simulating it
// (simulateEstimates over the cost model's stage estimates, Note [Interleaved memory]): its
// searchSeconds and iterationSeconds are the simulated iteration. The stage estimates are the
// cost model's with the transfers that wrap around (the last position to the first, and the
// gradients back) timed on the link between those ranks.
PlanEvaluation evaluateInterleaved(const CostModel& model, const Plan& plan) {
  const PlanRequest& request = model.request();
  const int count = static_cast<int>(plan.stages.size());
  const int positions = count / plan.virtualStages;
  PlanEvaluation result;
  std::vector<double> recomputeBytes;
  for (int s = 0; s < count; ++s) {
    const StagePlan& st = plan.stages[s];
    StageChoice choice{st.firstBlock, st.lastBlock, st.replicaCount, st.firstRank, st.recompute,
                       count - 1 - s, st.zero, st.tensorParallel};
    const RangeTotals range = model.ranges().range(st.firstBlock, st.lastBlock);
    const MemberRange member =
        model.member(range, st.firstBlock, st.lastBlock, st.tensorParallel, false);
    StageEstimate e = model.stage(member, choice, plan.microBatchCount, plan.schedule);
    const int last = st.firstRank + st.rankCount() - 1;
    const core::CommProfile& comm = request.comm;
    if (s % positions == positions - 1 && s + 1 < count) {
      const int next = plan.stages[0].firstRank;
      e.sendForwardSeconds = (model.sameNode(st.firstRank, next) ? comm.p2pIntraNode
                                                                  : comm.p2pInterNode)
                                 .seconds(e.outputBytes);
    }
    if (s % positions == 0 && s > 0) {
      const StagePlan& previous = plan.stages[positions - 1];
      const int previousLast = previous.firstRank + previous.rankCount() - 1;
      e.sendBackwardSeconds = (model.sameNode(previousLast, last) ? comm.p2pIntraNode
                                                                   : comm.p2pInterNode)
                                  .seconds(e.inputBytes);
    }
    e.stageSeconds = e.forwardSeconds + e.backwardSeconds + e.sendForwardSeconds +
                     e.sendBackwardSeconds;
    const double mb = static_cast<double>(e.microBatchPerReplica);
    // A recompute stage's one re-run micro-batch: its activations on one rank (1/t sharded).
    recomputeBytes.push_back(st.recompute ? member.range.activationBytes.at(mb) : 0);
    result.stages.push_back(e);
  }
  const SimulationResult sim = simulateEstimates(result.stages, recomputeBytes,
                                                 plan.microBatchCount, plan.schedule,
                                                 plan.virtualStages);
  LazyMessage memoryProblems;
  for (int s = 0; s < count; ++s) {
    StageEstimate& e = result.stages[s];
    e.activationBytes = sim.activationBytesAtPeak[s];
    e.heldMicroBatches = e.bytesPerHeldMicroBatch > 0
                             ? static_cast<int>(std::lround((e.activationBytes - recomputeBytes[s]) /
                                                            e.bytesPerHeldMicroBatch))
                             : 0;
    e.heldMicroBatches = std::max(0, e.heldMicroBatches);
    e.baseMemoryBytes = e.staticMemoryBytes();
    e.totalMemoryBytes = e.baseMemoryBytes + e.activationBytes;
    result.peakMemoryBytes = std::max(result.peakMemoryBytes, sim.peakMemoryBytes[s]);
    if (s < positions && sim.peakMemoryBytes[s] > model.memoryLimit())
      memoryProblems() << "position " << s << " (stages " << s << ", " << s + positions
                     << (plan.virtualStages > 2 ? ", ..." : "") << ") needs "
                     << sim.peakMemoryBytes[s] << " bytes > limit " << model.memoryLimit() << "; ";
  }
  result.pipelineSeconds = sim.pipelineSeconds;
  result.iterationSeconds = result.searchSeconds = sim.iterationSeconds;
  result.allreduceSeconds = sim.iterationSeconds - sim.pipelineSeconds;
  result.problem = memoryProblems.str();
  result.feasible = result.problem.empty();
  return result;
}

}  // namespace

PlanEvaluation evaluatePlanWith(const CostModel& model, const Plan& plan, bool searchOnly) {
  const PlanRequest& request = model.request();
  PlanEvaluation result;
  result.problem = shapeProblem(request, plan);
  if (!result.problem.empty()) return result;
  if (plan.virtualStages > 1) return evaluateInterleaved(model, plan);
  const int stageCount = static_cast<int>(plan.stages.size());
  double sum = 0, maxFirst = 0, maxSecond = 0, maxAllreduce = 0;
  LazyMessage memoryProblems;
  std::vector<StageTimes> times;
  times.reserve(stageCount);
  result.stages.reserve(stageCount);
  for (int s = 0; s < stageCount; ++s) {
    const StagePlan& st = plan.stages[s];
    StageChoice choice{st.firstBlock, st.lastBlock, st.replicaCount, st.firstRank, st.recompute,
                       stageCount - 1 - s, st.zero, st.tensorParallel};
    StageEstimate e = model.stage(choice, plan.microBatchCount, plan.schedule);
    sum += e.stageSeconds;
    auto [first, second] = CostModel::periodParts(e, plan.schedule);
    maxFirst = std::max(maxFirst, first);
    maxSecond = std::max(maxSecond, second);
    maxAllreduce = std::max(maxAllreduce, e.allreduceSeconds);
    result.peakMemoryBytes = std::max(result.peakMemoryBytes, e.totalMemoryBytes);
    if (e.totalMemoryBytes > model.memoryLimit()) {
      // A search's evaluation only needs to know that the plan does not fit: the planners
      // evaluate many plans that do not, and formatting their numbers cost the baselines half
      // of their time on the 1024-device plans of bench/plan_scaling.
      if (searchOnly) {
        result.problem = "stage " + std::to_string(s) + " exceeds the memory limit";
        return result;
      }
      memoryProblems() << "stage " << s << " needs " << e.totalMemoryBytes << " bytes > limit "
                       << model.memoryLimit() << "; ";
    }
    times.push_back({e.forwardSeconds + e.sendForwardSeconds, e.backwardSeconds + e.sendBackwardSeconds});
    result.stages.push_back(e);
  }
  // Note [Search objective and reported estimate] in cost_model.h.
  result.searchSeconds = CostModel::iterationSeconds(sum, maxFirst + maxSecond, maxAllreduce,
                                                     plan.microBatchCount);
  result.allreduceSeconds = maxAllreduce;
  if (!searchOnly) {
    result.pipelineSeconds = estimatePipelineSeconds(times, plan.microBatchCount, plan.schedule);
    result.iterationSeconds = result.pipelineSeconds + maxAllreduce;
  }
  result.problem = memoryProblems.str();
  result.feasible = result.problem.empty();
  return result;
}

}  // namespace autostage::decomposer
