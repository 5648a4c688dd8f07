// The exact DP over the block sequence; see Note [DP search space] in dp_stage_search.h and
// Note [Pipeline cost model] in cost_model.h.
#include "decomposer/dp_stage_search.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "decomposer/cost_model.h"

namespace autostage::decomposer {

int deviceUnit(int devices) {
  int unit = 1;
  while (devices / unit > 64) unit *= 2;
  return unit;
}

std::vector<int> replicaCandidates(int units) {
  std::vector<int> result;
  for (int r = 1; r <= units; ++r) {
    bool powerOfTwo = (r & (r - 1)) == 0;
    bool threeTimesPower = r % 3 == 0 && ((r / 3) & (r / 3 - 1)) == 0;
    if (units <= 16 || r <= 8 || powerOfTwo || threeTimesPower || r == units) result.push_back(r);
  }
  return result;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A partial plan for a suffix of the blocks. `previous*` point to the label it extends.
struct Label {
  double sum = 0, maxStage = 0, maxAllreduce = 0;
  int previousCell = -1, previousLabel = -1;
  int replicaUnits = 0;
  bool recompute = false;
};

bool dominates(const Label& a, const Label& b) {
  return a.sum <= b.sum && a.maxStage <= b.maxStage && a.maxAllreduce <= b.maxAllreduce;
}

// Inserts unless dominated; drops the labels the new one dominates.
void insertLabel(std::vector<Label>& cell, const Label& label) {
  for (const Label& l : cell)
    if (dominates(l, label)) return;
  cell.erase(std::remove_if(cell.begin(), cell.end(), [&](const Label& l) { return dominates(label, l); }),
             cell.end());
  cell.push_back(label);
}

struct Best {
  double seconds = kInf;
  Plan plan;
};

// One DP run for a fixed micro-batch count and schedule. Cells are indexed by
// (first block of the suffix a, device units used by the suffix u, stages in the suffix k capped
// at kCap); a decreases monotonically along transitions, so cells at a are final when visited.
class SuffixSearch {
 public:
  SuffixSearch(const CostModel& model, int microBatches, Schedule schedule, Best& best)
      : model_(model), request_(model.request()), microBatches_(microBatches), schedule_(schedule),
        best_(best) {
    blocks_ = model.ranges().blockCount();
    unit_ = deviceUnit(request_.devices);
    units_ = request_.devices / unit_;
    forcedStages_ = request_.options.partitionNum;
    kCap_ = forcedStages_ > 0 ? forcedStages_
                              : (schedule == Schedule::OneFOneB ? std::max(0, microBatches - 1) : 0);
    for (int r : replicaCandidates(units_))
      if (model.microBatchPerReplica(microBatches, r * unit_) > 0) replicas_.push_back(r);
    cells_.resize(static_cast<size_t>(blocks_ + 1) * (units_ + 1) * (kCap_ + 1));
    prefixLowerBound_ = computePrefixLowerBound();
  }

  // Long function by necessity: the DP's three nested choices share the source cell's labels.
  void run() {
    cells_[cellIndex(blocks_, 0, 0)].push_back(Label{});
    for (int a = blocks_; a > 0; --a) {
      for (int u = 0; u <= units_; ++u) {
        for (int k = 0; k <= kCap_; ++k) {
          const int source = cellIndex(a, u, k);
          if (cells_[source].empty()) continue;
          if (forcedStages_ > 0 && k >= forcedStages_) continue;
          for (int r : replicas_) {
            if (u + r > units_) break;
            for (bool recompute : {false, true}) extend(source, a, u, k, r, recompute);
          }
        }
      }
    }
    collect();
  }

 private:
  int cellIndex(int a, int u, int k) const { return (a * (units_ + 1) + u) * (kCap_ + 1) + k; }

  // Lower bound on the summed stage time of blocks [0, a): compute at the smallest micro-batch.
  std::vector<double> computePrefixLowerBound() const {
    std::vector<double> bound(blocks_ + 1, 0);
    if (replicas_.empty()) return bound;
    double mb = static_cast<double>(model_.microBatchPerReplica(microBatches_, replicas_.back() * unit_));
    for (int b = 0; b < blocks_; ++b) {
      RangeTotals t = model_.ranges().range(b, b);
      bound[b + 1] = bound[b] + t.forwardSeconds.at(mb) + t.backwardSeconds.at(mb);
    }
    return bound;
  }

  // Prepends stages [first, a-1] for every first < a to the labels of `source`.
  void extend(int source, int a, int u, int k, int r, bool recompute) {
    const int nextK = std::min(k + 1, kCap_);
    const int firstRank = request_.devices - (u + r) * unit_;
    const double limit = model_.memoryLimit();
    for (int first = a - 1; first >= 0; --first) {
      StageChoice choice{first, a - 1, r * unit_, firstRank, recompute, k};
      RangeTotals range = model_.ranges().range(first, a - 1);
      StageEstimate e = model_.stage(range, choice, microBatches_, schedule_);
      // Everything but the communication buffers grows as the stage grows: stop there.
      if (e.totalMemoryBytes - e.commBufferBytes > limit) break;
      if (e.totalMemoryBytes > limit) continue;
      const int target = cellIndex(first, u + r, nextK);
      const size_t labelCount = cells_[source].size();
      for (size_t i = 0; i < labelCount; ++i) {
        const Label& from = cells_[source][i];
        Label next{from.sum + e.stageSeconds, std::max(from.maxStage, e.stageSeconds),
                   std::max(from.maxAllreduce, e.allreduceSeconds), source, static_cast<int>(i),
                   r, recompute};
        double bound = CostModel::iterationSeconds(next.sum + prefixLowerBound_[first],
                                                   next.maxStage, next.maxAllreduce, microBatches_);
        if (bound >= best_.seconds) continue;
        insertLabel(cells_[target], next);
      }
    }
  }

  void collect() {
    for (int u = 1; u <= units_; ++u) {
      for (int k = 0; k <= kCap_; ++k) {
        if (forcedStages_ > 0 && k != forcedStages_) continue;
        const int cell = cellIndex(0, u, k);
        for (size_t i = 0; i < cells_[cell].size(); ++i) {
          const Label& l = cells_[cell][i];
          double seconds = CostModel::iterationSeconds(l.sum, l.maxStage, l.maxAllreduce, microBatches_);
          if (seconds < best_.seconds) best_ = {seconds, reconstruct(cell, static_cast<int>(i))};
        }
      }
    }
  }

  Plan reconstruct(int cell, int label) const {
    Plan plan;
    plan.microBatchCount = microBatches_;
    plan.schedule = schedule_;
    int block = 0;
    while (cells_[cell][label].previousCell >= 0) {
      const Label& l = cells_[cell][label];
      const int sourceBlock = l.previousCell / ((units_ + 1) * (kCap_ + 1));
      StagePlan stage{block, sourceBlock - 1, l.replicaUnits * unit_, 0, l.recompute};
      plan.stages.push_back(stage);
      block = sourceBlock;
      cell = l.previousCell;
      label = l.previousLabel;
    }
    int used = 0;
    for (const StagePlan& s : plan.stages) used += s.replicaCount;
    int rank = request_.devices - used;
    for (StagePlan& s : plan.stages) s.firstRank = rank, rank += s.replicaCount;
    return plan;
  }

  const CostModel& model_;
  const PlanRequest& request_;
  const int microBatches_;
  const Schedule schedule_;
  Best& best_;
  int blocks_ = 0, unit_ = 1, units_ = 1, forcedStages_ = 0, kCap_ = 0;
  std::vector<int> replicas_;
  std::vector<std::vector<Label>> cells_;
  std::vector<double> prefixLowerBound_;
};

}  // namespace

Plan planDynamicProgramming(const PlanRequest& request) {
  request.validate();
  CostModel model(request);
  Best best;
  auto log = core::logger("DPStaging");
  auto start = std::chrono::steady_clock::now();
  for (int microBatches : request.options.microBatchCandidates()) {
    for (Schedule schedule : request.options.scheduleCandidates()) {
      SuffixSearch(model, microBatches, schedule, best).run();
      double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (elapsed > 2.0)
        log->info("Searching: pipeline={} schedule={} done after {:.1f} s, best so far {:.6f} s",
                  microBatches, scheduleName(schedule), elapsed, best.seconds);
    }
  }
  AUTOSTAGE_CHECK_AS(PlanError, best.seconds < kInf, infeasibleMessage(request));
  best.plan.decomposer = "dp";
  best.plan.predictedSeconds = best.seconds;
  return best.plan;
}

}  // namespace autostage::decomposer
