// The shared cost model; see Note [Pipeline cost model] in cost_model.h.
#include "decomposer/cost_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/precision.h"

namespace autostage::decomposer {
namespace {

constexpr int kMaxParamTableBlocks = 2048;

core::LinearCost operator+(core::LinearCost a, const core::LinearCost& b) {
  return {a.fixed + b.fixed, a.perSample + b.perSample};
}
core::LinearCost operator-(core::LinearCost a, const core::LinearCost& b) {
  return {a.fixed - b.fixed, a.perSample - b.perSample};
}
core::LinearCost operator/(core::LinearCost a, double d) { return {a.fixed / d, a.perSample / d}; }

std::vector<std::vector<double>> sparseTable(const std::vector<double>& values) {
  std::vector<std::vector<double>> table{values};
  for (size_t width = 2; width <= values.size(); width *= 2) {
    const auto& prev = table.back();
    std::vector<double> level(values.size() - width + 1);
    for (size_t i = 0; i < level.size(); ++i) level[i] = std::max(prev[i], prev[i + width / 2]);
    table.push_back(std::move(level));
  }
  return table;
}

}  // namespace

ShardableCost operator+(const ShardableCost& a, const ShardableCost& b) {
  return {a.forwardSeconds + b.forwardSeconds,
          a.backwardSeconds + b.backwardSeconds,
          a.activationBytes + b.activationBytes,
          a.paramBytes + b.paramBytes,
          a.allreducePairs + b.allreducePairs,
          a.allreduceBytes + b.allreduceBytes,
          a.memberForwardSeconds + b.memberForwardSeconds,
          a.memberBackwardSeconds + b.memberBackwardSeconds};
}
ShardableCost operator-(const ShardableCost& a, const ShardableCost& b) {
  return {a.forwardSeconds - b.forwardSeconds,
          a.backwardSeconds - b.backwardSeconds,
          a.activationBytes - b.activationBytes,
          a.paramBytes - b.paramBytes,
          a.allreducePairs - b.allreducePairs,
          a.allreduceBytes - b.allreduceBytes,
          a.memberForwardSeconds - b.memberForwardSeconds,
          a.memberBackwardSeconds - b.memberBackwardSeconds};
}

ShardableCost ShardableSpan::costAt(int t) const {
  ShardableCost c = cost;
  if (const std::optional<MemberTimes>& m = measured[slot(t)]) {
    c.memberForwardSeconds = m->forwardSeconds;
    c.memberBackwardSeconds = m->backwardSeconds;
  } else {
    c.memberForwardSeconds = c.forwardSeconds / t;
    c.memberBackwardSeconds = c.backwardSeconds / t;
  }
  return c;
}

RangeIndex::RangeIndex(const PlanRequest& request)
    : blockCount_(static_cast<int>(request.blocks.size())), shared_(&request.sharedParams) {
  const int n = blockCount_;
  forward_.assign(n + 1, {});
  backward_.assign(n + 1, {});
  activation_.assign(n + 1, {});
  ownParams_.assign(n + 1, 0);
  std::vector<double> wf(n), wp(n);
  // Only a request allowing tensor parallelism pays for these (Note [Tensor-parallel cost]).
  if (!request.shardable.empty() && request.options.tensorParallel != "1") {
    straddling_.resize(n);
    for (const ShardableSpan& s : request.shardable) {
      if (s.correction())
        corrections_.push_back(&s);
      else
        for (int b = s.firstBlock + 1; b <= s.lastBlock; ++b) straddling_[b].push_back(&s);
    }
    // Note [Tensor-parallel working memory]
    std::vector<unsigned> blockDegrees(n, ShardableSpan::kAllDegrees);
    leftEdgeEnd_.resize(n);
    rightEdgeStart_.resize(n);
    for (int b = 0; b < n; ++b) leftEdgeEnd_[b] = b - 1, rightEdgeStart_[b] = b + 1;
    for (const ShardableSpan& s : request.shardable)
      for (int b = s.firstBlock; b <= s.lastBlock && !s.correction(); ++b) {
        blockDegrees[b] &= s.degrees;
        if (b > s.firstBlock) leftEdgeEnd_[b] = std::max(leftEdgeEnd_[b], s.lastBlock);
        if (b < s.lastBlock) rightEdgeStart_[b] = std::min(rightEdgeStart_[b], s.firstBlock);
      }
    const bool split = std::any_of(request.blocks.begin(), request.blocks.end(),
                                   [](const BlockCost& b) { return b.replicatedWorkingBytes; });
    for (int t : {2, 4, 8}) {
      if (!split) break;
      std::vector<double> fixed(n), perSample(n);
      for (int i = 0; i < n; ++i) {
        const BlockCost& b = request.blocks[i];
        fixed[i] = b.workingBytes.fixed;
        perSample[i] = b.workingBytes.perSample;
        if (!b.replicatedWorkingBytes || ((blockDegrees[i] >> t) & 1u) == 0) continue;
        fixed[i] = std::max(b.replicatedWorkingBytes->fixed, fixed[i] / t);
        perSample[i] = std::max(b.replicatedWorkingBytes->perSample, perSample[i] / t);
      }
      splitWorkingFixed_[degreeIndex(t)] = sparseTable(fixed);
      splitWorkingPerSample_[degreeIndex(t)] = sparseTable(perSample);
    }
    for (int t : {2, 4, 8}) {
      std::vector<ShardableCost>& sums = shardableByLast_[degreeIndex(t)];
      sums.assign(n + 1, {});
      for (const ShardableSpan& s : request.shardable)
        if (s.splitsAt(t) && !s.correction())
          sums[s.lastBlock + 1] = sums[s.lastBlock + 1] + s.costAt(t);
      for (int i = 0; i < n; ++i) sums[i + 1] = sums[i + 1] + sums[i];
    }
  }
  for (int i = 0; i < n; ++i) {
    const BlockCost& b = request.blocks[i];
    forward_[i + 1] = forward_[i] + b.forwardSeconds;
    backward_[i + 1] = backward_[i] + b.backwardSeconds;
    activation_[i + 1] = activation_[i] + b.activationBytes;
    ownParams_[i + 1] = ownParams_[i] + b.paramBytes;
    wf[i] = b.workingBytes.fixed;
    wp[i] = b.workingBytes.perSample;
    cutAfter_.push_back(b.cutBytesAfter);
  }
  workingFixed_ = sparseTable(wf);
  workingPerSample_ = sparseTable(wp);
  if (n > kMaxParamTableBlocks || request.sharedParams.empty()) return;
  // paramTable_[a * n + b]: shared bytes used by [a, b]. A parameter whose first use at or after
  // a is block f counts for every b >= f: add at f, then prefix-sum over b.
  paramTable_.assign(static_cast<size_t>(n) * n, 0);
  for (int a = 0; a < n; ++a) {
    double* row = &paramTable_[static_cast<size_t>(a) * n];
    for (const SharedParam& p : request.sharedParams) {
      auto it = std::lower_bound(p.blocks.begin(), p.blocks.end(), a);
      if (it != p.blocks.end()) row[*it] += p.bytes;
    }
    for (int b = a + 1; b < n; ++b) row[b] += row[b - 1];
  }
}

ShardableCost RangeIndex::shardable(int first, int last, int t) const {
  if (straddling_.empty()) return {};
  ShardableCost sum = shardableEndingIn(first, last, t);
  for (const ShardableSpan* s : straddling_[first])
    if (s->lastBlock <= last && s->splitsAt(t)) sum = sum - s->costAt(t);
  for (const ShardableSpan* s : corrections_)
    if (first <= s->firstBlock && s->lastBlock <= last && s->splitsAt(t)) sum = sum + s->cost;
  return sum;
}

core::LinearCost RangeIndex::workingAt(int first, int last, int t, bool lowerBound) const {
  const auto& fixed = splitWorkingFixed_[degreeIndex(t)];
  const auto& perSample = splitWorkingPerSample_[degreeIndex(t)];
  core::LinearCost w;
  const auto take = [&](const std::vector<std::vector<double>>& f,
                        const std::vector<std::vector<double>>& p, int a, int b) {
    w.fixed = std::max(w.fixed, rangeMax(f, a, b));
    w.perSample = std::max(w.perSample, rangeMax(p, a, b));
  };
  if (fixed.empty()) {
    take(workingFixed_, workingPerSample_, first, last);
    return w;
  }
  // The blocks a span the stage holds only part of reaches: whole (none on the left when
  // bounding every extension to the left, which may take those spans in).
  const int innerFirst = lowerBound ? first : std::max(first, leftEdgeEnd_[first] + 1);
  const int innerLast = std::min(last, rightEdgeStart_[last] - 1);
  if (innerFirst <= innerLast) take(fixed, perSample, innerFirst, innerLast);
  if (first < innerFirst)
    take(workingFixed_, workingPerSample_, first, std::min(last, innerFirst - 1));
  if (innerLast < last)
    take(workingFixed_, workingPerSample_, std::max(first, innerLast + 1), last);
  return w;
}

double RangeIndex::rangeMax(const std::vector<std::vector<double>>& table, int first, int last) const {
  int length = last - first + 1, level = 0;
  while ((2 << level) <= length) ++level;
  return std::max(table[level][first], table[level][last - (1 << level) + 1]);
}

double RangeIndex::paramBytes(int first, int last) const {
  double own = ownParams_[last + 1] - ownParams_[first];
  if (!paramTable_.empty()) return own + paramTable_[static_cast<size_t>(first) * blockCount_ + last];
  for (const SharedParam& p : *shared_) {
    auto it = std::lower_bound(p.blocks.begin(), p.blocks.end(), first);
    if (it != p.blocks.end() && *it <= last) own += p.bytes;
  }
  return own;
}

RangeTotals RangeIndex::range(int first, int last) const {
  AUTOSTAGE_INTERNAL_ASSERT(0 <= first && first <= last && last < blockCount_, "block range [",
                            first, ", ", last, "] outside 0..", blockCount_ - 1);
  RangeTotals r;
  r.forwardSeconds = forward_[last + 1] - forward_[first];
  r.backwardSeconds = backward_[last + 1] - backward_[first];
  r.activationBytes = activation_[last + 1] - activation_[first];
  r.workingBytes = {rangeMax(workingFixed_, first, last), rangeMax(workingPerSample_, first, last)};
  r.hasPrevious = first > 0;
  r.hasNext = last + 1 < blockCount_;
  if (r.hasPrevious) r.cutIn = cutAfter_[first - 1];
  if (r.hasNext) r.cutOut = cutAfter_[last];
  r.paramBytes = paramBytes(first, last);
  return r;
}

namespace {

// What every rank holds as the caller: its local batch's output rows (and as much again for their
// gradients in training; Note [Pipeline cost model]).
double callerBytesOf(const PlanRequest& request) {
  const double localBatch = std::ceil(double(request.batchSize) / double(request.devices));
  return request.outputBytesPerSample * localBatch;
}

}  // namespace

CostModel::CostModel(const PlanRequest& request)
    : request_(request),
      ranges_(request),
      memoryLimit_(request.memoryLimit()),
      castCopyRatio_(core::castCopyRatio(core::parsePrecision(request.options.precision))),
      callerBytes_(callerBytesOf(request)) {}

// The gradient allreduce of a replicated stage flattens its gradients into buckets of at most
// gradient_bucket_bytes (staging/gradient_sync.h) one at a time.
double CostModel::allreduceBucketBytes(const RangeTotals& range, int replicaCount) const {
  if (replicaCount <= 1) return 0;
  return std::min(request_.options.gradientBucketBytes, range.paramBytes);
}

StageEstimate CostModel::stage(const StageChoice& choice, int microBatches, Schedule schedule) const {
  return stage(ranges_.range(choice.firstBlock, choice.lastBlock), choice, microBatches, schedule);
}

// Note [Tensor-parallel cost]: the sharded parts / t, the rest whole.
RangeTotals CostModel::shardRange(const RangeTotals& range, const ShardableCost& s, int t) {
  RangeTotals r = range;
  r.forwardSeconds = range.forwardSeconds - s.forwardSeconds + s.memberForwardSeconds;
  r.backwardSeconds = range.backwardSeconds - s.backwardSeconds + s.memberBackwardSeconds;
  r.activationBytes = range.activationBytes - s.activationBytes + s.activationBytes / t;
  r.paramBytes = range.paramBytes - s.paramBytes + s.paramBytes / t;
  return r;
}

// Ring all-reduces over the t ranks of a replica (one node when the stage is aligned to t).
double CostModel::tensorParallelAllreduceSeconds(const ShardableCost& s,
                                                 const StageChoice& choice, double mb) const {
  const int t = choice.tensorParallel;
  if (t <= 1 || s.allreducePairs == 0) return 0;
  const core::LinkCost& link =
      sameNode(choice.firstRank, choice.firstRank + t - 1) ? request_.comm.allreduceWithinNode(t)
                                                           : request_.comm.allreduceInterNode;
  return s.allreducePairs * link.latencySeconds +
         2.0 * (t - 1) / t * s.allreduceBytes.at(mb) / link.bytesPerSecond;
}

// Note [Pipeline cost model]; with tensorParallel > 1, Note [Tensor-parallel cost]: `range` is
// replaced by what one rank of the group runs and holds, and the stage spans r t ranks.
StageEstimate CostModel::stage(const RangeTotals& range, const StageChoice& choice,
                               int microBatches, Schedule schedule) const {
  if (choice.tensorParallel <= 1) return stageOf(range, nullptr, choice, microBatches, schedule);
  return stage(member(range, choice.firstBlock, choice.lastBlock, choice.tensorParallel, false),
               choice, microBatches, schedule);
}

// Note [Tensor-parallel stops]
// The searches stop extending a stage to the left (a smaller first block) once its memory or its
// compute rules out every label, as both only grow with the stage at degree 1. At degree t > 1
// they need not: taking in the rest of a pattern shards it. A span lies within an extension
// [f', l] (f' <= f) only if it ends in [f', l]; those ending in [f', f) lie within [f', f) and
// shard part of what those blocks add. So charging [f, l] with every span ending in it sharded,
// whether or not it starts in it, and no all-reduce, bounds every extension from below; the
// searches stop on this bound and keep the labels of stage() that fit. The working bytes alike:
// the blocks the spans starting before f reach counted split (Note [Tensor-parallel working
// memory] in cost_model.h), as an extension taking those spans in would count them.
StageEstimate CostModel::stageLowerBound(const RangeTotals& range, const StageChoice& choice,
                                         int microBatches, Schedule schedule) const {
  if (choice.tensorParallel <= 1) return stage(range, choice, microBatches, schedule);
  return stage(member(range, choice.firstBlock, choice.lastBlock, choice.tensorParallel, true),
               choice, microBatches, schedule);
}

MemberRange CostModel::member(const RangeTotals& range, int first, int last, int t,
                              bool lowerBound) const {
  MemberRange m;
  m.tensorParallel = t;
  if (t <= 1) {
    m.range = range;
    return m;
  }
  if (lowerBound) {
    m.shardable = ranges_.shardableEndingIn(first, last, t);
    m.shardable.allreducePairs = 0;
    m.shardable.allreduceBytes = {};
  } else {
    m.shardable = ranges_.shardable(first, last, t);
  }
  m.range = shardRange(range, m.shardable, t);
  m.range.workingBytes = ranges_.workingAt(first, last, t, lowerBound);
  return m;
}

const MemberRange& MemberRanges::get(int t, bool lowerBound) {
  std::optional<MemberRange>& m = members_[lowerBound][t <= 1 ? 0 : t == 2 ? 1 : t == 4 ? 2 : 3];
  if (!m) m = model_->member(*range_, first_, last_, t, lowerBound);
  return *m;
}

StageEstimate CostModel::stage(const MemberRange& member, const StageChoice& choice,
                               int microBatches, Schedule schedule) const {
  AUTOSTAGE_CHECK(member.tensorParallel == std::max(1, choice.tensorParallel),
                  "a member range of degree ", member.tensorParallel, " for a stage of degree ",
                  choice.tensorParallel);
  return stageOf(member.range, member.tensorParallel > 1 ? &member.shardable : nullptr, choice,
                 microBatches, schedule);
}

StageEstimate CostModel::stageOf(const RangeTotals& range, const ShardableCost* shardable,
                                 const StageChoice& choice, int microBatches,
                                 Schedule schedule) const {
  const core::CommProfile& comm = request_.comm;
  const int t = choice.tensorParallel;
  const int r = choice.replicaCount, first = choice.firstRank, ranks = r * t;
  StageEstimate e;
  e.microBatchPerReplica = microBatchPerReplica(microBatches, r);
  const double mb = static_cast<double>(e.microBatchPerReplica);
  e.forwardSeconds = range.forwardSeconds.at(mb);
  if (t > 1) {
    e.tensorParallelForwardSeconds = e.tensorParallelBackwardSeconds =
        tensorParallelAllreduceSeconds(*shardable, choice, mb);
    e.forwardSeconds += e.tensorParallelForwardSeconds;
  }
  e.backwardSeconds = range.backwardSeconds.at(mb) + (choice.recompute ? e.forwardSeconds : 0);
  if (t > 1) e.backwardSeconds += e.tensorParallelBackwardSeconds;
  e.inputBytes = range.hasPrevious ? range.cutIn.at(mb) : 0;
  e.outputBytes = range.hasNext ? range.cutOut.at(mb) : 0;
  if (range.hasNext) {
    const auto& link = sameNode(first, first + ranks) ? comm.p2pIntraNode : comm.p2pInterNode;
    e.sendForwardSeconds = link.seconds(e.outputBytes);
  }
  if (range.hasPrevious) {
    const auto& link = sameNode(first - 1, first + ranks - 1) ? comm.p2pIntraNode : comm.p2pInterNode;
    e.sendBackwardSeconds = link.seconds(e.inputBytes);
  }
  e.stageSeconds = e.forwardSeconds + e.backwardSeconds + e.sendForwardSeconds + e.sendBackwardSeconds;
  e.paramBytes = e.gradientBytes = range.paramBytes;
  if (r > 1) {
    const auto& link = sameNode(first, first + ranks - 1) ? comm.allreduceIntraNode : comm.allreduceInterNode;
    e.allreduceSeconds = link.seconds(2.0 * (r - 1) / r * range.paramBytes);
  }
  // Note [ZeRO-1 cost]
  // Under ZeRO-1 each of the r replicas keeps the optimizer state of 1/r of the stage's parameter
  // elements. Its gradients are reduce-scattered and its parameters all-gathered after the step:
  // (r-1)/r of the bytes each, the same traffic as the ring allreduce counted above, so the time
  // is unchanged and only the optimizer bytes shrink. (Gradients stay whole on every replica.)
  const bool sharded = choice.zero && r > 1;
  e.optimizerBytes = request_.options.optParamFactor * range.paramBytes / (sharded ? r : 1);
  e.castCacheBytes = castCopyRatio_ * range.paramBytes;
  e.heldMicroBatches = heldMicroBatches(schedule, microBatches, choice.stagesAfter);
  const double act = range.activationBytes.at(mb);
  e.bytesPerHeldMicroBatch = choice.recompute ? e.inputBytes : act;
  e.activationBytes = e.heldMicroBatches * e.bytesPerHeldMicroBatch + (choice.recompute ? act : 0);
  e.workingBytes = range.workingBytes.at(mb);
  e.commBufferBytes =
      2 * (e.inputBytes + e.outputBytes) + allreduceBucketBytes(range, r) + 2 * callerBytes();
  e.baseMemoryBytes = e.staticMemoryBytes() + (choice.recompute ? act : 0);
  e.totalMemoryBytes = e.baseMemoryBytes + e.heldMicroBatches * e.bytesPerHeldMicroBatch;
  if (request_.options.usage == PlanUsage::Inference) forwardOnly(e, microBatches);
  return e;
}

// Note [Pipeline cost model], inference (Note [Plan usage]): no backward, no gradients, no
// optimizer state, no allreduce; a stage keeps no activations for a backward, only its output
// of every micro-batch until the step ends (the sends complete and the caller's rows are
// gathered then), and the working set of the node running.
void CostModel::forwardOnly(StageEstimate& e, int microBatches) const {
  e.backwardSeconds = e.sendBackwardSeconds = e.allreduceSeconds = 0;
  e.commBufferBytes = 2 * (e.inputBytes + e.outputBytes) + callerBytes();  // no allreduce, no
                                                                          // output gradients
  e.stageSeconds = e.forwardSeconds + e.sendForwardSeconds;
  e.gradientBytes = e.optimizerBytes = 0;
  e.heldMicroBatches = microBatches;
  e.bytesPerHeldMicroBatch = e.outputBytes;
  e.activationBytes = e.heldMicroBatches * e.bytesPerHeldMicroBatch;
  e.baseMemoryBytes = e.staticMemoryBytes();
  e.totalMemoryBytes = e.baseMemoryBytes + e.activationBytes;
}

}  // namespace autostage::decomposer
