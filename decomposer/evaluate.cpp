// evaluatePlan: checks a plan's shape and recomputes its cost from the cost model, stage by stage,
// without any of the planner's search state (the tests compare the two).
#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "decomposer/cost_model.h"
#include "decomposer/pipeline_time.h"
#include "decomposer/plan.h"

namespace autostage::decomposer {
namespace {

// Empty when the plan is well formed for the request; otherwise what is wrong.
std::string shapeProblem(const PlanRequest& request, const Plan& plan) {
  std::ostringstream out;
  const int n = static_cast<int>(request.blocks.size());
  if (plan.stages.empty()) return "plan has no stages";
  if (plan.microBatchCount < 1) return "micro-batch count must be >= 1";
  int nextBlock = 0, nextRank = plan.stages.front().firstRank;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& st = plan.stages[s];
    if (st.firstBlock != nextBlock || st.lastBlock < st.firstBlock) {
      out << "stage " << s << " covers blocks " << st.firstBlock << ".." << st.lastBlock
          << " but must start at block " << nextBlock;
      return out.str();
    }
    if (st.replicaCount < 1 || st.firstRank != nextRank) {
      out << "stage " << s << " must have >= 1 replica starting at rank " << nextRank;
      return out.str();
    }
    if (static_cast<int64_t>(plan.microBatchCount) * st.replicaCount > request.batchSize) {
      out << "stage " << s << ": " << plan.microBatchCount << " micro-batches x "
          << st.replicaCount << " replicas exceed the batch " << request.batchSize;
      return out.str();
    }
    nextBlock = st.lastBlock + 1;
    nextRank = st.firstRank + st.replicaCount;
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

PlanEvaluation evaluatePlanWith(const CostModel& model, const Plan& plan, bool searchOnly) {
  const PlanRequest& request = model.request();
  PlanEvaluation result;
  result.problem = shapeProblem(request, plan);
  if (!result.problem.empty()) return result;
  const int stageCount = static_cast<int>(plan.stages.size());
  double sum = 0, maxFirst = 0, maxSecond = 0, maxAllreduce = 0;
  std::ostringstream memoryProblems;
  std::vector<StageTimes> times;
  times.reserve(stageCount);
  for (int s = 0; s < stageCount; ++s) {
    const StagePlan& st = plan.stages[s];
    StageChoice choice{st.firstBlock, st.lastBlock, st.replicaCount, st.firstRank, st.recompute,
                       stageCount - 1 - s, st.zero};
    StageEstimate e = model.stage(choice, plan.microBatchCount, plan.schedule);
    sum += e.stageSeconds;
    auto [first, second] = CostModel::periodParts(e, plan.schedule);
    maxFirst = std::max(maxFirst, first);
    maxSecond = std::max(maxSecond, second);
    maxAllreduce = std::max(maxAllreduce, e.allreduceSeconds);
    result.peakMemoryBytes = std::max(result.peakMemoryBytes, e.totalMemoryBytes);
    if (e.totalMemoryBytes > model.memoryLimit())
      memoryProblems << "stage " << s << " needs " << e.totalMemoryBytes << " bytes > limit "
                     << model.memoryLimit() << "; ";
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
