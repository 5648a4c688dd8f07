// Pipeline operation orders; see Note [Pipeline schedules] in pipeline_schedule.h.
#include "core/pipeline_schedule.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace autostage::core {

std::string pipelineShapeProblem(const std::string& schedule, int positions, int virtualStages,
                                 int microBatches) {
  std::ostringstream out;
  if (schedule != "gpipe" && schedule != "1f1b") {
    out << "the schedule '" << schedule << "' is unknown (gpipe, 1f1b)";
  } else if (positions < 1 || microBatches < 1 || virtualStages < 1) {
    out << "a pipeline needs at least one position, micro-batch and stage per position, got "
        << positions << ", " << microBatches << " and " << virtualStages;
  } else if (virtualStages > 1 && schedule != "1f1b") {
    out << "virtual stages (v=" << virtualStages << ") run the interleaved 1f1b schedule, not "
        << schedule << "; plan with schedule=1f1b or virtual_stages=1";
  } else if (virtualStages > 1 && positions < 2) {
    out << "virtual stages (v=" << virtualStages << ") need at least 2 pipeline positions, got "
        << positions << "; plan with virtual_stages=1";
  } else if (virtualStages > 1 && microBatches % positions != 0) {
    out << "interleaved 1f1b runs micro-batches in groups of the pipeline depth: "
        << microBatches << " micro-batches is not a multiple of " << positions
        << " positions; plan with a pipeline (micro-batch count) that is, or virtual_stages=1";
  }
  return out.str();
}

int pipelineWarmup(const std::string& schedule, int position, int positions, int virtualStages,
                   int microBatches) {
  const std::string problem =
      pipelineShapeProblem(schedule, positions, virtualStages, microBatches);
  AUTOSTAGE_CHECK_AS(PlanError, problem.empty(), problem);
  AUTOSTAGE_INTERNAL_ASSERT(position >= 0 && position < positions, "position ", position,
                            " outside 0..", positions - 1);
  const int total = microBatches * virtualStages;
  if (schedule == "gpipe") return total;
  if (virtualStages == 1) return std::min(positions - position - 1, microBatches);
  if (microBatches == positions) return total;  // one group: every forward first (Megatron)
  return std::min((positions - position - 1) * 2 + (virtualStages - 1) * positions, total);
}

namespace {

// The k-th forward (or backward) operation of a position: which chunk, which micro-batch.
PipelineOp interleavedOp(int k, bool forward, int positions, int virtualStages) {
  const int group = positions * virtualStages;
  int chunk = (k % group) / positions;
  if (!forward) chunk = virtualStages - 1 - chunk;
  return {forward, chunk, (k / group) * positions + k % positions};
}

}  // namespace

std::vector<PipelineOp> pipelineOrder(const std::string& schedule, int position, int positions,
                                      int virtualStages, int microBatches) {
  const int warmup = pipelineWarmup(schedule, position, positions, virtualStages, microBatches);
  const int total = microBatches * virtualStages;
  std::vector<PipelineOp> order;
  order.reserve(2 * total);
  auto op = [&](int k, bool forward) {
    if (virtualStages == 1) return PipelineOp{forward, 0, k};
    return interleavedOp(k, forward, positions, virtualStages);
  };
  for (int k = 0; k < warmup; ++k) order.push_back(op(k, true));
  for (int i = 0; i < total - warmup; ++i) {
    order.push_back(op(warmup + i, true));
    order.push_back(op(i, false));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(op(k, false));
  return order;
}

}  // namespace autostage::core
