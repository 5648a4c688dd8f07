#pragma once
// The one cost model shared by the DP planner, the evaluator, the baselines and the simulator.
//
// Note [Pipeline cost model]
// A stage covers blocks [first, last] and is replicated on ranks [firstRank, firstRank + r).
// Stages sit on ascending rank ranges in pipeline order. With M micro-batches of the global batch
// B, each replica runs micro-batches of mb = ceil(B / (M r)) samples (the largest share).
//   forward  F = sum fwd(mb);   backward Bw = sum bwd(mb) (+ F when recomputing)
//   sendF = p2p(cut after the stage at mb)   (none for the last stage)
//   sendB = p2p(cut before the stage at mb)  (gradients back; none for the first stage)
//   stage time t = F + Bw + sendF + sendB    (a transfer occupies its sender)
//   allreduce AR = lat + 2(r-1)/r * paramBytes / bw (0 when r == 1), after the pipeline flushes
//   iteration T = sum_s t_s + (M - 1) * period + max_s AR_s, where the steady-state period is
//     1f1b:  max_s t_s                                   (stages alternate forward and backward)
//     gpipe: max_s (F + sendF)_s + max_s (Bw + sendB)_s  (all forwards, then all backwards: two
//            flow shops of identical jobs, each of makespan sum + (M - 1) * max)
// The gpipe form is exact. The 1f1b form is neither an upper nor a lower bound of the schedule
// for uneven stages (Note [1f1b pipeline estimate] in pipeline_time.h has a worked example and a
// tight lower bound). This closed form is what the planners search (see below), not the time
// they report.
// A p2p transfer is intra-node when the sender's ranks and the neighbouring rank of the next
// (previous) stage lie on one node; an allreduce is intra-node when its ranks lie on one node.
// Memory per device: params + grads + opt_param_factor * params
//   + cast cache: 0.5 * params for precision bf16/fp16 (0 for fp32)
//   + activations held: all M micro-batches (gpipe) or min(M, stages after + 1) (1f1b), each
//     act(mb); a recomputing stage holds only its input per micro-batch plus one act(mb)
//   + working(mb) + communication buffers 2 * (input + output bytes at mb)
//   + for r > 1, one gradient allreduce bucket: min(gradient_bucket_bytes, params)
//   + caller buffers: every rank receives its local batch's graph outputs (B / devices rows) and
//     sends their gradients back: 2 * output bytes per sample * B / devices.
// (The last three are the commBufferBytes of a stage.)
// For an inference plan (Note [Plan usage]) backward, gradients, optimizer state and allreduce are
// 0 and a stage holds its output of each of the M micro-batches instead of activations.
// Mixed precision (precision=bf16|fp16, Note [Autocast execution] in
// frontend/torchscript/autocast.h): params, grads and optimizer state stay fp32. Autocast keeps a
// 2-byte copy of each fp32 weight a matmul/conv casts, for the length of a stage's forward run: the
// cast cache term (an upper bound: it counts every parameter). The copies autograd saves for
// backward, and the smaller bf16 activations, are in act(mb) and working(mb), because profiling
// runs under the same autocast; input/output bytes are the boundary values' bytes in the dtype the
// import probe recorded under autocast, so a boundary autocast produces in bf16 costs half its fp32
// bytes.
//
// Note [Search objective and reported estimate]
// Every plan has two times (PlanEvaluation, Plan):
//   searchSeconds     the closed form T above. The DP searches it and is exact over it (the
//                     exhaustive-search test compares it); the baselines choose among their
//                     candidates by it; the DP's seeding, pruning and first plan compare it.
//   iterationSeconds  the reported estimate (Plan::predictedSeconds, the deployment's predicted
//                     iteration, the CLI's predicted_iteration_ms): estimatePipelineSeconds over
//                     the stage times (forward = F + sendF, backward = Bw + sendB) plus max AR.
//                     Exact for gpipe (equal to the closed form), the tight path bound for 1f1b
//                     (Note [1f1b pipeline estimate]).
// Measured against the simulator on the planners' outputs of estimate_test.cpp (208 gpipe and
// 157 1f1b plans of random instances): the reported estimate is at most 2.3% below the simulated
// 1f1b time (never above it) and exact for gpipe; the closed form is up to 17.6% off for 1f1b.
// The tests require the reported estimate within 5% on every plan a planner produces. The DP
// returns, among the plans its search completed, the one that simulates fastest (Note
// [Finalists] in dp_stage_search.h).

// Note [Tensor-parallel cost]
// A stage of tensor-parallel degree t (StagePlan::tensorParallel, Megatron-LM style) runs each
// replica on t ranks of one node, so it uses r t ranks for r replicas; the t ranks share a
// replica's micro-batch (mb is unchanged). What is sharded is the request's ShardableSpans (plan.h)
// lying wholly within the stage's blocks; everything else, a pattern the stage holds only part of
// included, runs replicated on all t ranks. The shardable patterns, as they appear in the IR
// (Note [Tensor-parallel patterns] in tensor_parallel_patterns.h has the exact rules):
//   MLP: a linear layer (aten::linear, or aten::mm/matmul/addmm with a PARAM weight) whose
//     output reaches a second linear layer through element-wise operations only (bias add,
//     gelu/relu/silu, dropout, mul); the first is split by output columns, the second by input
//     rows. The element-wise ops between them act on 1/t of the columns: sharded too.
//   Attention: the Q, K and V linear layers of one input (column-parallel, split by heads), the
//     per-head ops between them and the output projection (view/permute by heads, matmul,
//     scale, mask, softmax, dropout, matmul), and the output projection (row-parallel).
// Each pattern ends in one all-reduce of the row-parallel output forward (before its bias add,
// residual add or layer norm, which stay replicated) and one of the column-parallel input's
// gradient backward. A vocabulary embedding or LM head (split by rows of its table) has one
// all-reduce, counted as a pair of half its bytes each way, a head tied to its embedding both
// (Note [Tensor-parallel patterns]).
// Per replica, at micro-batch mb, with S the ShardableCost summed over those spans:
//   F  = (F_all - S.fwd) + S.fwd_t + ARf     Bw = (B_all - S.bwd) + S.bwd_t + ARb
//   where S.fwd_t, S.bwd_t are the sharded operations' times on one member at t: measured by the
//   profiler on a member's slices (ShardableSpan::measured; Note [Tensor-parallel profile] in
//   profiler/split_profile.h), else S.fwd / t and S.bwd / t
//   ARf = ARb = S.pairs * lat + 2 (t-1)/t * S.allreduceBytes(mb) / bw   (the comm profile's
//     all-reduce among t ranks of a node, CommProfile::allreduceWithinNode(t))
//   params per rank P = (P_all - S.params) + S.params / t; gradients P; optimizer state
//   opt_param_factor P (/ r under ZeRO-1); cast cache castCopyRatio P
//   activations per micro-batch (A_all - S.act) + S.act / t, where S.act leaves out what the
//   column-parallel linears keep (their input, whole on every rank); boundary bytes whole (every
//   rank of the group holds the full boundary values); working bytes as Note [Tensor-parallel
//   working memory].
// The data-parallel gradient allreduce runs over the r replicas of each shard: P bytes,
// intra-node when all r t ranks lie on one node. Recomputation reruns the forward, all-reduces
// included. With t = 1 nothing changes: the estimate is computed by the same expressions.
// The degrees searched are PlanOptions::tensorParallelCandidates (tensor_parallel=1, the default:
// {1}, and then the request carries no spans and the search is the one without tensor
// parallelism). A stage of degree t starts at a rank that is a multiple of t (dividing the
// devices per node), so each replica's t ranks share a node (evaluatePlan refuses other
// layouts). Interleaved plans give all their stages one degree, each the option allows (Note
// [Interleaved search]); so do the baselines (data_parallel, uniform, param_balanced), the
// fastest the option allows.

// Note [Tensor-parallel working memory]
// A stage's working bytes are the largest temporary set of one node group, the block's largest
// (BlockCost::workingBytes: fixed and per-sample parts maxed apart). A group of a pattern the
// stage shards at degree t holds 1/t of its temporaries (the split logits under a vocabulary-
// parallel loss, the column-parallel outputs) and of its parameters' gradient temporaries; the
// others hold theirs whole. So a rank's working bytes are, over the stage's blocks, the largest
// of: a block's whole working bytes where a span the stage holds only part of reaches it (the
// runtime leaves that pattern replicated) or one that does not split at t does; else
// max(replicatedWorkingBytes, workingBytes / t), the groups outside every pattern whole and
// the pattern's groups split (an upper bound: the block's largest group is taken as a
// pattern's). Blocks holding no pattern's group keep workingBytes. Measured by
// bench/memory_accuracy (transformer_vocab, tp=2, the loss's temporaries over the split logits):
// 76.9 MiB predicted, 72.9 measured; counted whole, 96.9 predicted.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "decomposer/plan.h"

namespace autostage::decomposer {

// Sums over a contiguous block range, O(1) per query after O(n) (or O(n^2) params) setup.
struct RangeTotals {
  core::LinearCost forwardSeconds, backwardSeconds, activationBytes, workingBytes;
  core::LinearCost cutIn, cutOut;  // cut before the first block / after the last block
  double paramBytes = 0;           // distinct parameters used by the range
  bool hasPrevious = false, hasNext = false;
};

class RangeIndex {
 public:
  explicit RangeIndex(const PlanRequest& request);
  RangeTotals range(int first, int last) const;
  // The blocks' ShardableCost summed (Note [Tensor-parallel cost]) over the spans splitting at
  // degree t; zero when the request allows no tensor parallelism. Kept out of RangeTotals, which
  // the search copies often. A span counts when it lies within [first, last]: those ending in the
  // range, less those among them that start before it.
  ShardableCost shardable(int first, int last, int t) const;
  // The largest working bytes of a rank of a degree-t stage over [first, last] (Note
  // [Tensor-parallel working memory]); with `lowerBound`, no more than those of every stage
  // extending it to the left (Note [Tensor-parallel stops]).
  core::LinearCost workingAt(int first, int last, int t, bool lowerBound) const;
  // The spans splitting at t ending in [first, last], whether or not they start in it.
  ShardableCost shardableEndingIn(int first, int last, int t) const {
    const std::vector<ShardableCost>& sums = shardableByLast_[degreeIndex(t)];
    return sums.empty() ? ShardableCost{} : sums[last + 1] - sums[first];
  }
  int blockCount() const { return blockCount_; }

 private:
  double paramBytes(int first, int last) const;
  double rangeMax(const std::vector<std::vector<double>>& table, int first, int last) const;

  int blockCount_ = 0;
  std::vector<core::LinearCost> forward_, backward_, activation_;  // prefix sums, size n + 1
  std::vector<std::vector<double>> workingFixed_, workingPerSample_;  // sparse tables
  std::vector<core::LinearCost> cutAfter_;
  // Per degree 2, 4, 8 (degreeIndex), prefix sums over blocks of the spans splitting at it that
  // end at each block (size n + 1, empty when the request allows no tensor parallelism), and per
  // block the spans starting before it that end at or after it.
  static int degreeIndex(int t) { return t <= 2 ? 0 : t <= 4 ? 1 : 2; }
  std::array<std::vector<ShardableCost>, 3> shardableByLast_;
  std::vector<std::vector<const ShardableSpan*>> straddling_;
  // Tied tables' corrections (ShardableSpan::correction), counted only by shardable(): leaving
  // them out of the lower bounds' sums only lowers those.
  std::vector<const ShardableSpan*> corrections_;
  // Note [Tensor-parallel working memory]: per block, the last block of the spans starting
  // before it that hold it (else the block before), and the first block of those holding it and
  // the next block (else the next); per degree (degreeIndex), sparse tables of each block's
  // working bytes with its patterns split (empty when no block holds a pattern).
  std::vector<int> leftEdgeEnd_, rightEdgeStart_;
  std::array<std::vector<std::vector<double>>, 3> splitWorkingFixed_, splitWorkingPerSample_;
  std::vector<double> ownParams_;    // prefix sums of block-only parameter bytes
  std::vector<double> paramTable_;   // n x n shared-parameter bytes (empty for large n)
  const std::vector<SharedParam>* shared_ = nullptr;
};

// Where a stage is and how it runs; `stagesAfter` is the number of stages following it.
struct StageChoice {
  int firstBlock = 0, lastBlock = 0;
  int replicaCount = 1, firstRank = 0;
  bool recompute = false;
  int stagesAfter = 0;
  bool zero = false;  // ZeRO-1 (Note [ZeRO-1 cost]); ignored with one replica
  int tensorParallel = 1;  // ranks per replica (Note [Tensor-parallel cost])
};

// A range as one rank of a stage of degree t holds and runs it (Note [Tensor-parallel cost]):
// its totals with the sharded parts / t and the working bytes of that degree, and the sharded
// parts (for the all-reduces). CostModel::member makes it once; every stage choice of that range
// and degree then reuses it (the searches try many replica counts and settings per range).
struct MemberRange {
  RangeTotals range;
  ShardableCost shardable;
  int tensorParallel = 1;
};

class CostModel;

// The member ranges (CostModel::member) of blocks [first, last] at each degree, exact and lower
// bound, each made on first use: the searches try many shapes and settings of one range, and
// those of one degree share it. Holds references to the model and the totals.
class MemberRanges {
 public:
  MemberRanges(const CostModel& model, const RangeTotals& range, int first, int last)
      : model_(&model), range_(&range), first_(first), last_(last) {}
  const MemberRange& get(int t, bool lowerBound);

 private:
  const CostModel* model_;
  const RangeTotals* range_;
  int first_, last_;
  std::optional<MemberRange> members_[2][4];  // [lowerBound][degree 1, 2, 4, 8]
};

// Holds a reference to the request, which must outlive it.
class CostModel {
 public:
  explicit CostModel(const PlanRequest& request);

  const PlanRequest& request() const { return request_; }
  const RangeIndex& ranges() const { return ranges_; }
  double memoryLimit() const { return memoryLimit_; }

  // Per-replica micro-batch size; 0 when M * r exceeds the global batch (no sample per replica).
  int64_t microBatchPerReplica(int microBatches, int replicaCount) const {
    const int64_t share = static_cast<int64_t>(microBatches) * replicaCount;
    if (share > request_.batchSize) return 0;
    return (request_.batchSize + share - 1) / share;
  }
  // Whether a stage of `replicaCount` replicas can run `microBatches` micro-batches: at least a
  // sample each, and with micro_batch_size the batch exactly that many rows x micro-batches x
  // replicas (Note [Fixed micro-batch size] in plan.h).
  bool microBatchesFit(int microBatches, int replicaCount) const {
    const int64_t rows = request_.options.microBatchSize;
    if (rows > 0)
      return static_cast<int64_t>(microBatches) * replicaCount * rows == request_.batchSize;
    return microBatchPerReplica(microBatches, replicaCount) > 0;
  }
  StageEstimate stage(const StageChoice& choice, int microBatches, Schedule schedule) const;
  StageEstimate stage(const RangeTotals& range, const StageChoice& choice, int microBatches,
                      Schedule schedule) const;
  // Note [Tensor-parallel stops]: no more than the compute times and the memory (less
  // communication buffers) of stage(), for this stage and every stage extending it to the left
  // (same last block, first block <= choice.firstBlock); stage() itself at degree 1.
  StageEstimate stageLowerBound(const RangeTotals& range, const StageChoice& choice,
                                int microBatches, Schedule schedule) const;
  // What stage() and stageLowerBound() (with `lowerBound`) make of blocks [first, last] (totals
  // `range`) at degree t before they look at the rest of the choice; stage(member, choice)
  // then equals them for every choice of that range and degree.
  MemberRange member(const RangeTotals& range, int first, int last, int t, bool lowerBound) const;
  StageEstimate stage(const MemberRange& member, const StageChoice& choice, int microBatches,
                      Schedule schedule) const;
  bool sameNode(int rankA, int rankB) const {
    return rankA / request_.devicesPerNode == rankB / request_.devicesPerNode;
  }
  // Micro-batches whose activations (inference: outputs) a stage holds at its peak.
  int heldMicroBatches(Schedule schedule, int microBatches, int stagesAfter) const {
    if (schedule == Schedule::GPipe || request_.options.usage == PlanUsage::Inference)
      return microBatches;
    return std::min(microBatches, stagesAfter + 1);
  }
  // The two per-stage times whose maxima add up to the steady-state period (see the Note).
  static std::pair<double, double> periodParts(const StageEstimate& e, Schedule schedule) {
    if (schedule == Schedule::OneFOneB) return {e.stageSeconds, 0.0};
    return {e.forwardSeconds + e.sendForwardSeconds, e.backwardSeconds + e.sendBackwardSeconds};
  }
  static double iterationSeconds(double sumStage, double period, double maxAllreduce, int microBatches) {
    return sumStage + (microBatches - 1) * period + maxAllreduce;
  }

 private:
  double allreduceBucketBytes(const RangeTotals& range, int replicaCount) const;
  // The range as one rank of a tensor-parallel group of t holds and runs it, all-reduces left out.
  static RangeTotals shardRange(const RangeTotals& range, const ShardableCost& shardable, int t);
  // One direction's tensor-parallel all-reduces per micro-batch (forward = backward).
  double tensorParallelAllreduceSeconds(const ShardableCost& shardable, const StageChoice& choice,
                                        double mb) const;
  // stage() over `range` (sharded for the choice's degree) with `shardable` its sharded parts.
  StageEstimate stageOf(const RangeTotals& range, const ShardableCost* shardable,
                        const StageChoice& choice, int microBatches, Schedule schedule) const;
  double callerBytes() const { return callerBytes_; }
  // Turns a training estimate into the inference one (Note [Plan usage]).
  void forwardOnly(StageEstimate& e, int microBatches) const;

 private:
  const PlanRequest& request_;
  RangeIndex ranges_;
  double memoryLimit_;
  double castCopyRatio_;  // cast-cache bytes per parameter byte (core::castCopyRatio)
  double callerBytes_;    // callerBytes(), computed once
};

// evaluatePlan with a model already built for the request (saves rebuilding the range index).
// With `searchOnly`, the reported estimate is skipped (iterationSeconds and pipelineSeconds stay
// 0) and the evaluation stops at the first stage over the memory limit (`problem` names it,
// without its numbers; the other fields are then partial): for planners comparing many
// candidates by searchSeconds.
PlanEvaluation evaluatePlanWith(const CostModel& model, const Plan& plan, bool searchOnly = false);

}  // namespace autostage::decomposer
