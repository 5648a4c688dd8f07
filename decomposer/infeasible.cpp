// The "no feasible plan" message: what memory would be needed and which options to change.
#include <algorithm>
#include <sstream>

#include "decomposer/cost_model.h"
#include "decomposer/dp_stage_search.h"
#include "decomposer/interleaved_search.h"

namespace autostage::decomposer {
namespace {

// Smallest memory block `b` needs as a stage of its own over every replica count, micro-batch
// count and recompute setting, holding a single micro-batch (a lower bound for any stage with b).
double smallestBlockMemory(const CostModel& model, int b) {
  const PlanRequest& request = model.request();
  double best = -1;
  for (int microBatches : request.options.microBatchCandidates(request.batchSize)) {
    for (int r = 1; r <= request.devices; ++r) {
      if (model.microBatchPerReplica(microBatches, r) == 0) break;
      if (!model.microBatchesFit(microBatches, r)) continue;  // Note [Fixed micro-batch size]
      for (int t : request.options.tensorParallelCandidates(request.devicesPerNode)) {
        if (r * t > request.devices) continue;
        for (bool recompute : request.options.recomputeCandidates()) {
          StageChoice choice{b,         b, r, 0, recompute, 0, request.options.zeroCandidates().back(),
                             t};
          double m = model.stage(choice, microBatches, Schedule::OneFOneB).totalMemoryBytes;
          if (best < 0 || m < best) best = m;
        }
      }
    }
  }
  return best;
}

// Note [Tensor-parallel cost] (cost_model.h): what tensor parallelism could do for the neediest
// block, `shardable` of whose parameter bytes a tensor-parallel group splits.
std::string tensorParallelAdvice(const PlanRequest& request, double shardable) {
  const std::string& option = request.options.tensorParallel;
  std::ostringstream out;
  if (shardable <= 0) {
    if (option != "1")
      out << "(tensor_parallel=" << option << " cannot help: that block has nothing shardable), ";
    else if (request.devicesPerNode > 1)  // not searched, so not known: the patterns say
      out << "allow tensor parallelism (tensor_parallel=auto: linear and attention layers split "
          << "over up to " << std::min(8, request.devicesPerNode) << " ranks of a node), ";
    return out.str();
  }
  if (option == "1" && request.devicesPerNode > 1)
    out << "allow tensor parallelism (tensor_parallel=auto, or 2/4/8 dividing the "
        << request.devicesPerNode << " devices per node; that block shards " << shardable
        << " parameter bytes), ";
  else if (option == "1")
    out << "use nodes of several devices with tensor_parallel=auto (that block shards "
        << shardable << " parameter bytes; tensor_parallel needs its ranks on one node), ";
  return out.str();
}

}  // namespace

std::string infeasibleMessage(const PlanRequest& request) {
  const int blocks = static_cast<int>(request.blocks.size());
  const int forced = request.options.partitionNum;
  if (forced > blocks || forced > request.devices) {
    std::ostringstream out;
    out << "partition_num=" << forced << " asks for more stages than there are "
        << (forced > request.devices ? "devices (" + std::to_string(request.devices) + ")"
                                     : "cuttable blocks (" + std::to_string(blocks) + ")")
        << ". Use partition_num <= " << std::min(blocks, request.devices)
        << " or 0 to let the planner choose. Blocks are never cut where a value crossing the "
        << "cut cannot be split by samples (ints from x.size(), tensors whose dim 0 is not the "
        << "batch); read sizes where they are used and keep the batch in dim 0 to get more cuts.";
    return out.str();
  }
  // A forced degree: every stage's replicas are groups of that many ranks, on ranks of their
  // own (v = 1) or sharing them with v - 1 others on P / v pipeline positions (Note
  // [Interleaved search] in interleaved_search.h).
  const std::vector<int> degrees = request.options.tensorParallelCandidates(request.devicesPerNode);
  if (forced > 0 && degrees.size() == 1 && degrees[0] > 1) {
    const int t = degrees[0], devices = request.devices;
    bool shape = false;
    for (int v : request.options.virtualStageCandidates())
      shape = shape || (v == 1 ? forced * t <= devices
                               : forced % v == 0 && positionsTile(devices, forced / v, t));
    if (!shape) {
      std::ostringstream out;
      out << "partition_num=" << forced << " stages at tensor_parallel=" << t
          << " do not fit on " << devices << " devices: each stage's replicas are groups of " << t
          << " ranks, so " << forced << " stages need " << forced * t << " devices (interleaved, "
          << "virtual_stages=v, " << forced << "/v pipeline positions of " << t
          << " ranks, their ranks dividing the devices). Use partition_num <= " << devices / t
          << ", tensor_parallel=auto or a smaller degree, or more devices.";
      return out.str();
    }
  }
  if (const int64_t rows = request.options.microBatchSize; rows > 0) {
    // Note [Fixed micro-batch size]: no replica and micro-batch count gives that size.
    bool any = false;
    for (int m : request.options.microBatchCandidates(request.batchSize))
      for (int r = 1; r <= request.devices; ++r) any = any || rows * m * r == request.batchSize;
    if (!any) {
      std::ostringstream out;
      out << "micro_batch_size=" << rows << " cannot divide the batch " << request.batchSize
          << " into micro-batches of " << rows << " rows on " << request.devices
          << " devices with the micro-batch counts tried (pipeline_num, min_pipeline, "
          << "max_pipeline): the batch must be " << rows << " x micro-batches x replicas. Use "
          << "a batch that is such a multiple, or another micro_batch_size (0: the planner "
          << "chooses).";
      return out.str();
    }
  }
  CostModel model(request);
  double needed = 0, largestParams = -1;
  int neediest = 0, largest = 0;
  for (int b = 0; b < model.ranges().blockCount(); ++b) {
    double m = smallestBlockMemory(model, b);
    if (m > needed) needed = m, neediest = b;
    double params = model.ranges().range(b, b).paramBytes;
    if (params > largestParams) largestParams = params, largest = b;
  }
  const double margin = 1.0 - request.options.memMargin;
  double shardable = 0;  // of patterns within the neediest block
  for (const ShardableSpan& s : request.shardable)
    if (s.firstBlock == neediest && s.lastBlock == neediest) shardable += s.cost.paramBytes;
  // Raising max_pipeline helps only below micro-batches of one sample (the planner's own limit
  // gets there where nothing fits: Note [Micro-batch count limit] in plan.h).
  const int limit = request.options.pipelineLimit();
  const bool belowOneSample = limit < request.batchSize;
  const std::string raiseLimit = belowOneSample ? "raise max_pipeline, " : "";
  std::ostringstream out;
  out << "no plan fits in " << model.memoryLimit() << " bytes per device (device memory "
      << request.deviceMemoryBytes()
      << " bytes, mem_margin " << request.options.memMargin << ", " << request.devices
      << " devices, batch " << request.batchSize << "). ";
  if (needed >= 0 && needed <= model.memoryLimit()) {
    // Each block fits as a stage of its own: what does not fit is their split over the devices.
    out << "Every block fits alone (the neediest, block " << neediest << " ("
        << request.blocks[neediest].name << "), needs " << needed << " bytes with the most "
        << "replicas and micro-batches), but no split of the " << blocks << " blocks into stages "
        << "fits on " << request.devices << " devices: stages small enough to fit need more "
        << "devices than there are, or "
        << (belowOneSample ? "micro-batches smaller than " + std::to_string(limit) +
                                 " micro-batches (max_pipeline=" +
                                 std::to_string(request.options.maxPipeline) + ") allow"
                           : "even micro-batches of one sample do not fit")
        << " (a stage holds the activations of its micro-batches in flight). To fix: " << raiseLimit
        << "use more devices or more device memory, a smaller batch, "
        << (request.options.recompute == "never" ? "allow recomputation (recompute=auto), " : "")
        << (request.options.tensorParallel == "1" && request.devicesPerNode > 1
                ? "allow tensor parallelism (tensor_parallel=auto), "
                : "")
        << "or lower opt_param_factor.";
    return out.str();
  }
  out << "The smallest per-device memory that could "
      << "work is at least " << needed / margin << " bytes: block " << neediest << " ("
      << request.blocks[neediest].name << ") needs " << needed
      << " bytes even alone, with the most replicas and micro-batches"
      << (request.options.recompute == "never" ? " (recompute=never)" : ", recomputed")
      << ". The largest "
      << "indivisible block is block " << largest << " (" << request.blocks[largest].name
      << ") with " << largestParams
      << " parameter bytes. To fix: give more device memory (mem_limit_gb / "
      << "--device-memory), lower mem_margin or opt_param_factor, " << raiseLimit
      << "use more devices, a smaller batch, "
      << (request.options.recompute == "never" ? "allow recomputation (recompute=auto), " : "")
      << tensorParallelAdvice(request, shardable)
      << "or raise max_blocks so large blocks can be split.";
  return out.str();
}

}  // namespace autostage::decomposer
