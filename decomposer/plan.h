#pragma once
// The planner's request and answer types (STYLE.md §6: request -> result, independent evaluator).
//
// A PlanRequest is self-contained: the block sequence with its costs, the communication profile,
// the cluster shape, the global batch and the options. Its text form (toText/parse) lets a bad
// plan be replayed without the graph. Everything is plain data; no torch, no MPI.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/plan_usage.h"
#include "core/profile.h"

namespace autostage::decomposer {

enum class Schedule { GPipe, OneFOneB };
std::string scheduleName(Schedule schedule);  // "gpipe", "1f1b"
// Parses "gpipe" or "1f1b"; throws ConfigError naming the bad text.
Schedule parseSchedule(const std::string& text);

// Note [Plan usage] (core/plan_usage.h): which API will run the plan decides its schedules.
using core::PlanUsage;
using core::parseUsage;
using core::usageName;

// Planner options; the keys of the same names in core/config.cpp.
struct PlanOptions {
  std::string decomposer = "dp";  // dp | data_parallel | uniform | param_balanced
  int maxBlocks = 256;
  int partitionNum = 0;  // 0: free stage count
  int pipelineNum = 0;   // 0: free micro-batch count
  // Note [Fixed micro-batch size]
  // micro_batch_size=N gives every stage's micro-batches exactly N rows per replica: the batch is
  // N x micro-batches x replicas for every stage (so every stage has the same replica count), and
  // the searches skip other shapes (the DP's shapes and its bounds through
  // CostModel::microBatchesFit, the baselines and refinements through the evaluator). Megatron-LM
  // users set this figure; autostage sets it for a model whose batch dimension torch.export
  // fixed (autostage/export.py), whose captured graph runs only that many rows. The micro-batch
  // counts searched are then every divisor of batch / N in [min_pipeline, max_pipeline], not
  // only powers of two (Megatron-LM's 530B GPT: micro-batches of 1 sample, 280 per replica).
  // 0: free.
  int microBatchSize = 0;
  int minPipeline = 1;
  // Note [Micro-batch count limit]
  // max_pipeline=N limits the micro-batch counts the search tries to N, as RaNNC's does. 0, the
  // default, is the planner's own limit: counts up to kFirstPipelineLimit (32, RaNNC's default,
  // where the search of a usual job stays fast) and, only where no plan fits within them, up to
  // the batch (planStages says so in the log). Megatron-LM's largest runs need that: its 1T GPT
  // on 3,072 A100s fits only with over a hundred micro-batches of a few samples per replica,
  // and a user planning it (`autostage plan --synthetic gpt:layers=128,...`) gets that plan,
  // not "no plan fits" with a hint to raise an option whose needed value nobody knows.
  static constexpr int kFirstPipelineLimit = 32;
  int maxPipeline = 0;
  // The largest count the search tries: max_pipeline, or for 0 the first limit (Note
  // [Micro-batch count limit]).
  int pipelineLimit() const {
    return maxPipeline > 0 ? maxPipeline : std::max(kFirstPipelineLimit, minPipeline);
  }
  std::string schedule = "auto";  // gpipe | 1f1b | auto
  std::string recompute = "auto";  // auto | always | never (activation recomputation per stage)
  std::string zero = "auto";       // auto | 1 | 0: ZeRO-1 in replicated stages (Note [ZeRO-1 cost])
  // auto | 1 | 2 | 4: stages per pipeline position, interleaved 1f1b (Note [Interleaved search]).
  std::string virtualStages = "auto";
  double memLimitGb = 0;          // 0: the device's own memory
  double memMargin = 0.1;
  double optParamFactor = 2;
  double gradientBucketBytes = 25 << 20;  // gradient_bucket_bytes (Note [Pipeline cost model])
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (Note [Pipeline cost model]: cast cache)
  // auto | 1 | 2 | 4 | 8: tensor-parallel degree per stage (Note [Tensor-parallel cost] in
  // cost_model.h). "1", the default, plans exactly as without tensor parallelism.
  std::string tensorParallel = "1";
  // Note [Plan usage]: set by the caller (the API the plan is for), not by a config key.
  PlanUsage usage = PlanUsage::TrainStep;

  // Throws ConfigError naming the first bad field, the value and the valid range.
  void validate() const;
  std::string toString() const;  // `key=value` pairs separated by spaces, config key names
  static PlanOptions fromConfig(const core::Config& config);
  // Micro-batch counts the search tries for a global batch of `batch` rows, ascending: the
  // powers of two in [minPipeline, pipelineLimit()] and every count in that range dividing the
  // batch (Note [Free micro-batch counts]); with micro_batch_size=N every count in that range
  // dividing batch / N, which is what N x micro-batches x replicas = batch allows (Note [Fixed
  // micro-batch size]); exactly pipelineNum when forced.
  //
  // Note [Free micro-batch counts]
  // m micro-batches over a stage's r replicas run ceil(batch / (m r)) rows each (CostModel::
  // microBatchPerReplica), so a stage runs no padding rows only where m r divides the batch, and
  // every Megatron-LM configuration (batch = micro-batch size x m x data-parallel replicas) has
  // such an m. RaNNC's powers of two alone miss them: Megatron-LM's 310B GPT as it ran (16
  // stages at tp=8 on 1,920 A100s, batch 2,160) planned 64 micro-batches, its stages of 20
  // replicas running 2 rows each where 1.69 are data (54.6 s predicted); with the divisors, 135
  // micro-batches, one row each over 16 replicas and two over 8 (43.7 s). The search over them
  // stays exact (the DP and the exhaustive search of the tests take the same counts); a batch that
  // is a power of two adds none. The baselines (uniform, param_balanced, data_parallel, and the
  // seeds of the DP's first plan) evaluate a count other than a power of two only where it splits
  // the batch evenly over their replicas: they try every count for every stage count, and the
  // padded ones made the first plan of the 530B on 2,520 devices take 1.1-1.4 s instead of 0.9 s.
  std::vector<int> microBatchCandidates(int64_t batch) const;
  // The schedules `schedule` allows for `usage` (Note [Plan usage]).
  std::vector<Schedule> scheduleCandidates() const;
  // Recompute settings the search tries per stage: {false, true} for auto, else the forced one;
  // {false} for inference (nothing is kept for a backward, so nothing to recompute).
  std::vector<bool> recomputeCandidates() const;
  // ZeRO-1 settings the search tries per replicated stage: {false, true} for auto (false first,
  // so true survives only where it fits and false does not; Note [ZeRO-1 cost]), else the forced
  // one; {false} for inference (no optimizer state). A stage of one replica never shards.
  std::vector<bool> zeroCandidates() const;
  // Virtual stage counts the planner tries: {1, 2, 4} for auto when the plan is for train_step
  // and may run 1f1b, else {1}; the forced one otherwise (Note [Interleaved search]).
  std::vector<int> virtualStageCandidates() const;
  // Tensor-parallel degrees a stage may use on nodes of `devicesPerNode` devices: the forced one,
  // or for auto those of {1, 2, 4, 8} dividing devicesPerNode. Throws ConfigError when a forced
  // degree does not divide devicesPerNode (a group of t ranks must sit on one node).
  std::vector<int> tensorParallelCandidates(int devicesPerNode) const;
};

// What Megatron-style tensor parallelism of degree t splits t ways in a pattern (Note
// [Tensor-parallel cost] in cost_model.h), or summed over the patterns of a block range.
struct ShardableCost {
  core::LinearCost forwardSeconds;   // of the blocks' forwardSeconds: the sharded operations
  core::LinearCost backwardSeconds;  // of the blocks' backwardSeconds
  core::LinearCost activationBytes;  // of the blocks' activationBytes
  // Of the blocks' own paramBytes, and the bytes of a table tied to a vocabulary embedding and
  // an LM head, a SharedParam each end splits (Note [Tied tables across stages] in
  // staging/gradient_sync.h); negative only in a correction (ShardableSpan::correction).
  double paramBytes = 0;
  // Column-then-row pairs (an MLP, an attention block) in the block: one all-reduce of the row
  // part's output forward and one of its gradient backward each.
  int allreducePairs = 0;
  core::LinearCost allreduceBytes;  // the pairs' row-parallel output bytes, summed
  // The sharded operations' times on one member at the degree these costs are summed for
  // (RangeIndex's per-degree sums; ShardableSpan::costAt): measured, or the whole ones / t.
  core::LinearCost memberForwardSeconds{}, memberBackwardSeconds{};
};
ShardableCost operator+(const ShardableCost& a, const ShardableCost& b);  // field by field
ShardableCost operator-(const ShardableCost& a, const ShardableCost& b);

// One shardable pattern over blocks [firstBlock, lastBlock] (Note [Tensor-parallel patterns] in
// tensor_parallel_patterns.h). A stage shards it only when it holds all of those blocks; a stage
// holding part of it runs that part replicated, and so does a stage whose degree the pattern
// does not split at (`degrees`: bit 1 << t for t in {2, 4, 8}; the runtime's check,
// decomposer::splitDegrees, e.g. 12 heads do not split 8 ways).
struct ShardableSpan {
  static constexpr unsigned kAllDegrees = (1u << 2) | (1u << 4) | (1u << 8);
  int firstBlock = 0, lastBlock = 0;
  ShardableCost cost;
  unsigned degrees = kAllDegrees;
  bool splitsAt(int t) const { return t >= 1 && t < 32 && ((degrees >> t) & 1u) != 0; }
  // Per degree 2, 4, 8 (slot 0, 1, 2): the sharded operations' forward and backward times on one
  // member, from the profile's SplitTimes (Note [Tensor-parallel profile] in
  // profiler/split_profile.h), each no more than the whole, or where a pattern runs nodes whole
  // at the degree (Note [Whole K/V heads] in tensor_parallel_split.h) the others' whole times / t
  // and those nodes' whole; absent: the whole ones / t.
  struct MemberTimes {
    core::LinearCost forwardSeconds, backwardSeconds;
  };
  std::array<std::optional<MemberTimes>, 3> measured{};
  static int slot(int t) { return t <= 2 ? 0 : t <= 4 ? 1 : 2; }
  // `cost` with its member times at degree t (> 1).
  ShardableCost costAt(int t) const;
  // A tied table's correction: a span over both ends of the table whose only cost is minus the
  // table's bytes, so that a stage sharding both ends splits it once. It shards nothing itself
  // (no time, no all-reduce).
  bool correction() const { return cost.paramBytes < 0; }
};

// Costs of one block of the linear block sequence. Times and bytes grow with the per-replica
// micro-batch size (`fixed + perSample * batch`).
struct BlockCost {
  std::string name;  // for logs, e.g. the module scope of the block's first node
  core::LinearCost forwardSeconds;
  core::LinearCost backwardSeconds;
  core::LinearCost activationBytes;
  // Peak temporary bytes: the largest fixed part and the largest per-sample part of the block's
  // node groups (a safe upper bound of the max of linear functions).
  core::LinearCost workingBytes;
  // Of workingBytes, the largest of the groups outside every tensor-parallel pattern: set for a
  // block holding a pattern's group when the request allows tensor parallelism (Note
  // [Tensor-parallel working memory] in cost_model.h).
  std::optional<core::LinearCost> replicatedWorkingBytes;
  core::LinearCost cutBytesAfter;  // bytes of BATCH values crossing the boundary after this block
  double paramBytes = 0;           // bytes of parameters used by this block only
};

// A parameter used by several blocks (e.g. a tied embedding): held once by every stage using it.
struct SharedParam {
  double bytes = 0;
  std::vector<int> blocks;  // ascending block indices
};

struct PlanRequest {
  std::vector<BlockCost> blocks;
  std::vector<SharedParam> sharedParams;
  // Note [Tensor-parallel cost]: the patterns tensor parallelism shards, ascending by lastBlock
  // (empty: nothing shardable, or tensor_parallel=1). `shardable` records of the text form.
  std::vector<ShardableSpan> shardable;
  core::CommProfile comm;
  int devices = 1;
  int devicesPerNode = 1;
  double deviceMemory = 0;  // bytes per device
  int64_t batchSize = 1;    // global batch
  // Bytes per sample of the graph outputs returned to the callers: every rank receives its local
  // batch's rows and sends their gradients back (Note [Pipeline cost model], caller buffers).
  double outputBytesPerSample = 0;
  PlanOptions options;

  // The device memory the plan is for: mem_limit_gb when set, else deviceMemory (bytes).
  double deviceMemoryBytes() const;
  // Bytes usable per device: deviceMemoryBytes() * (1 - mem_margin).
  double memoryLimit() const;
  // Throws PlanError/ConfigError naming the first bad field.
  void validate() const;
  std::string toText() const;
  static PlanRequest parse(const std::string& text);  // throws FormatError with the line
};

// One stage: a contiguous block range, replicated on ranks
// [firstRank, firstRank + replicaCount * tensorParallel): replica i on the tensorParallel ranks
// from firstRank + i * tensorParallel, which lie on one node.
struct StagePlan {
  int firstBlock = 0;
  int lastBlock = 0;  // inclusive
  int replicaCount = 1;
  int firstRank = 0;
  bool recompute = false;
  bool zero = false;  // ZeRO-1: optimizer state split over the replicas (replicaCount > 1)
  int tensorParallel = 1;  // ranks per replica (Note [Tensor-parallel cost] in cost_model.h)
  int rankCount() const { return replicaCount * tensorParallel; }
  bool operator==(const StagePlan& o) const {
    return firstBlock == o.firstBlock && lastBlock == o.lastBlock &&
           replicaCount == o.replicaCount && firstRank == o.firstRank &&
           recompute == o.recompute && zero == o.zero && tensorParallel == o.tensorParallel;
  }
};

struct Plan {
  std::string decomposer = "dp";
  std::vector<StagePlan> stages;  // pipeline order, covering blocks 0..n-1
  int microBatchCount = 1;
  Schedule schedule = Schedule::GPipe;
  // Stages per pipeline position (Note [Pipeline schedules] in core/pipeline_schedule.h): with
  // v > 1, stages.size() = v S and stage k sits on the ranks of stage k mod S (same firstRank and
  // replicaCount); the schedule is 1f1b, run interleaved.
  int virtualStages = 1;
  // Note [Search objective and reported estimate] (cost_model.h): the estimate reported as the
  // plan's iteration time (PlanEvaluation::iterationSeconds), and the closed form the planner
  // searched (PlanEvaluation::searchSeconds).
  double predictedSeconds = 0;
  double searchSeconds = 0;
  // How long each phase of the planner took that made it, in order (`plan --json`'s
  // phase_seconds): what a slower plan spent its time on. Not part of the plan itself.
  std::vector<std::pair<std::string, double>> phaseSeconds;
  std::string toString() const;
};

// Appends the time since the last mark (or construction) to a phase list.
class PhaseClock {
 public:
  explicit PhaseClock(std::vector<std::pair<std::string, double>>& phases)
      : phases_(phases), last_(std::chrono::steady_clock::now()) {}
  void mark(std::string phase) {
    const auto now = std::chrono::steady_clock::now();
    phases_.emplace_back(std::move(phase), std::chrono::duration<double>(now - last_).count());
    last_ = now;
  }

 private:
  std::vector<std::pair<std::string, double>>& phases_;
  std::chrono::steady_clock::time_point last_;
};

// Per-stage prediction of the cost model (decomposer/cost_model.h).
struct StageEstimate {
  int64_t microBatchPerReplica = 0;
  double forwardSeconds = 0;   // compute only
  double backwardSeconds = 0;  // compute, including recomputation
  double sendForwardSeconds = 0;   // activations to the next stage, per micro-batch
  double sendBackwardSeconds = 0;  // gradients to the previous stage, per micro-batch
  double stageSeconds = 0;         // all four above: one micro-batch's occupation of the stage
  double allreduceSeconds = 0;
  // Tensor-parallel all-reduces per micro-batch, included in forwardSeconds / backwardSeconds
  // (0 with tensorParallel 1; Note [Tensor-parallel cost]).
  double tensorParallelForwardSeconds = 0, tensorParallelBackwardSeconds = 0;
  double inputBytes = 0, outputBytes = 0;  // at the per-replica micro-batch
  double paramBytes = 0, gradientBytes = 0, optimizerBytes = 0;
  double castCacheBytes = 0;  // autocast's low-precision weight copies (0 for fp32)
  double activationBytes = 0;  // held by the schedule at its peak
  double workingBytes = 0, commBufferBytes = 0;
  double totalMemoryBytes = 0;
  int heldMicroBatches = 0;
  // totalMemoryBytes = baseMemoryBytes + heldMicroBatches * bytesPerHeldMicroBatch.
  double baseMemoryBytes = 0;
  double bytesPerHeldMicroBatch = 0;
  // The memory that does not depend on the schedule's progress: parameters, gradients,
  // optimizer state, cast cache, working set and communication buffers (the cost model and the
  // simulator both start from it; Note [Pipeline cost model]).
  double staticMemoryBytes() const {
    return paramBytes + gradientBytes + optimizerBytes + castCacheBytes + workingBytes +
           commBufferBytes;
  }
};

struct PlanEvaluation {
  bool feasible = false;
  std::string problem;  // why not feasible
  // The reported estimate: pipelineSeconds (estimatePipelineSeconds: exact for gpipe, the tight
  // path bound for 1f1b) + allreduceSeconds. What the user sees as the predicted time.
  double iterationSeconds = 0;
  double pipelineSeconds = 0;
  // The closed form of Note [Pipeline cost model] the planners search and compare plans by.
  double searchSeconds = 0;
  double allreduceSeconds = 0;
  double peakMemoryBytes = 0;
  std::vector<StageEstimate> stages;
};

// The planner (dispatches on options.decomposer) and the independent evaluator.
// planStages throws PlanError when no plan satisfies the memory limit (see infeasibleMessage).
struct Plan planStages(const PlanRequest& request);
PlanEvaluation evaluatePlan(const PlanRequest& request, const Plan& plan);

}  // namespace autostage::decomposer
