// Simulated refinement of a plan; see Note [Simulated refinement] in refine.h.
#include "decomposer/refine.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "decomposer/dp_stage_search.h"
#include "decomposer/simulator.h"

namespace autostage::decomposer {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// How far moves reach (Note [Simulated refinement]): boundaries moved up to kSpan blocks, up to
// kSpan adjacent boundaries moved together, a stage split at up to 2 kSpan places. Small requests
// (the exhaustive comparisons) are covered whole; large ones stay within the budget.
constexpr int kSpan = 4;
// Non-improving neighbours a local optimum is left through (Note [Simulated refinement]).
constexpr size_t kRunnersUp = 4;

bool choice(const std::vector<bool>& candidates) { return candidates.size() > 1; }

// Generates the neighbours of one plan and keeps the fastest; see the Note.
class Climb {
 public:
  Climb(const CostModel& model, double maxWork)
      : model_(model),
        options_(model.request().options),
        devices_(model.request().devices),
        unit_(deviceUnit(devices_)),
        maxWork_(maxWork),
        recompute_(options_.recomputeCandidates()),
        zero_(options_.zeroCandidates()),
        microBatches_(options_.microBatchCandidates(model.request().batchSize)),
        schedules_(searchedSchedules(options_)) {}

  Refinement run(const Plan& start) {
    result_.plan = start;
    result_.seconds = simulatedSeconds(model_, start);
    while (!result_.exhausted) {
      best_ = result_.seconds;
      improved_.reset();
      runnersUp_.clear();
      collecting_ = true;
      neighbours(result_.plan);
      collecting_ = false;
      // At a local optimum, one step further: the neighbours of its kRunnersUp fastest
      // neighbours (two moves where neither alone is faster).
      const auto runnersUp = std::move(runnersUp_);
      for (size_t i = 0; !improved_ && i < runnersUp.size() && !result_.exhausted; ++i)
        neighbours(runnersUp[i].second);
      if (!improved_) break;
      result_.plan = *improved_;
      result_.seconds = best_;
      ++result_.moves;
    }
    return result_;
  }

 private:
  void neighbours(const Plan& plan) {
    if (plan.virtualStages > 1)
      interleavedNeighbours(plan);
    else
      plainNeighbours(plan);
  }

  // A neighbour of a new shape: a plain plan's with every micro-batch count and schedule, an
  // interleaved plan's as it is.
  void offerShape(Plan plan) {
    if (plan.virtualStages > 1)
      offerOne(std::move(plan));
    else
      offer(std::move(plan));
  }

  // A plain neighbour, with every micro-batch count and schedule the options allow.
  void offer(Plan plan) {
    for (int m : microBatches_)
      for (Schedule schedule : schedules_) {
        plan.microBatchCount = m;
        plan.schedule = schedule;
        offerOne(plan);
      }
  }

  void offerOne(Plan plan) {
    if (result_.work >= maxWork_) {
      result_.exhausted = true;
      return;
    }
    // Evaluated after normalising its ranks and forced flags (and choosing a plain plan's).
    normalise(plan);
    if (plan.virtualStages == 1) chooseFlags(plan);
    ++result_.evaluations;
    result_.work += 2.0 * static_cast<double>(plan.stages.size()) * plan.microBatchCount;
    const double seconds = simulatedSeconds(model_, plan);
    if (seconds < best_ * (1 - 1e-12)) {
      best_ = seconds;
      improved_ = std::move(plan);
    } else if (collecting_ && seconds < kInf) {
      runnersUp_.emplace_back(seconds, std::move(plan));
      std::stable_sort(runnersUp_.begin(), runnersUp_.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      if (runnersUp_.size() > kRunnersUp) runnersUp_.pop_back();
    }
  }

  void normalise(Plan& plan) const {
    for (StagePlan& s : plan.stages) {
      if (!choice(recompute_)) s.recompute = recompute_.front();
      if (!choice(zero_)) s.zero = zero_.front();
      s.zero = s.zero && s.replicaCount > 1;
    }
    if (plan.virtualStages > 1) return;  // positions keep their ranks
    int rank = devices_;
    for (const StagePlan& s : plan.stages) rank -= s.rankCount();
    for (StagePlan& s : plan.stages) s.firstRank = rank, rank += s.rankCount();
  }

  // Per stage, the recompute and ZeRO-1 setting the options allow that fits in memory and runs
  // fastest (ties: neither). A stage's memory depends on its own setting only and a faster stage
  // never slows the simulated schedule, so this is the best setting for the plan's stages.
  void chooseFlags(Plan& plan) const {
    const int count = static_cast<int>(plan.stages.size());
    for (int s = 0; s < count; ++s) {
      StagePlan& st = plan.stages[s];
      double fastest = kInf;
      for (bool recompute : recompute_)
        for (bool asked : zero_) {
          const bool zero = asked && st.replicaCount > 1;  // one replica has nothing to shard
          if (zero != asked && zero_.size() > 1) continue;  // the same as zero=0, tried
          const StageChoice c{st.firstBlock, st.lastBlock, st.replicaCount, st.firstRank,
                              recompute, count - 1 - s, zero, st.tensorParallel};
          const StageEstimate e = model_.stage(c, plan.microBatchCount, plan.schedule);
          const double seconds = e.stageSeconds + e.allreduceSeconds;
          if (e.totalMemoryBytes > model_.memoryLimit() || seconds >= fastest) continue;
          fastest = seconds;
          st.recompute = recompute;
          st.zero = zero;
        }
    }
  }

  // Stage boundaries moved (the stages' replicas and flags kept).
  void boundaryNeighbours(const Plan& p) {
    const int count = static_cast<int>(p.stages.size());
    // Boundaries: the ones after stages first..last (up to kSpan of them), each moved one block
    // the same way.
    for (int first = 0; first + 1 < count; ++first)
      for (int last = first; last + 1 < count && last < first + kSpan; ++last)
        for (int step : {-1, 1}) {
          Plan n = p;
          bool empty = false;
          for (int s = first; s <= last; ++s) {
            n.stages[s].lastBlock += step;
            n.stages[s + 1].firstBlock += step;
          }
          for (int s = first; s <= last + 1; ++s)
            empty = empty || n.stages[s].lastBlock < n.stages[s].firstBlock;
          if (!empty) offerShape(std::move(n));
        }
    // One boundary moved further: up to kSpan blocks either way within its two stages.
    for (int s = 0; s + 1 < count; ++s)
      for (int last = std::max(p.stages[s].firstBlock, p.stages[s].lastBlock - kSpan);
           last < std::min(p.stages[s + 1].lastBlock, p.stages[s].lastBlock + kSpan + 1); ++last) {
        const int moved = last - p.stages[s].lastBlock;
        if (moved == 0 || moved == 1 || moved == -1) continue;  // the moves above
        Plan n = p;
        n.stages[s].lastBlock = last;
        n.stages[s + 1].firstBlock = last + 1;
        offerShape(std::move(n));
      }
  }

  void plainNeighbours(const Plan& p) {
    const int count = static_cast<int>(p.stages.size());
    int used = 0;
    // Moves count replicas; a stage of tensor-parallel degree t > 1 uses t ranks for each, and a
    // move that then overruns the devices or a node is refused by the evaluation (shapeProblem).
    for (const StagePlan& s : p.stages) used += s.rankCount();
    const int free = devices_ - used;
    boundaryNeighbours(p);
    // Replicas: from or to the free devices, or from one stage to another.
    for (int s = 0; s < count; ++s) {
      if (free >= unit_) {
        Plan n = p;
        n.stages[s].replicaCount += unit_;
        offer(std::move(n));
      }
      if (p.stages[s].replicaCount > unit_) {
        Plan n = p;
        n.stages[s].replicaCount -= unit_;
        offer(std::move(n));
        for (int t = 0; t < count; ++t) {
          if (t == s) continue;
          Plan m = p;
          m.stages[s].replicaCount -= unit_;
          m.stages[t].replicaCount += unit_;
          offer(std::move(m));
        }
      }
    }
    offer(p);  // the same stages with other micro-batch counts and schedules
    if (options_.partitionNum > 0) return;
    // Merges and splits.
    // A merged stage keeps both stages' replicas, or one stage's, the other's going to the free
    // devices or to any other stage.
    for (int s = 0; s + 1 < count; ++s) {
      const int a = p.stages[s].replicaCount, b = p.stages[s + 1].replicaCount;
      Plan merged = p;
      merged.stages[s].lastBlock = merged.stages[s + 1].lastBlock;
      merged.stages.erase(merged.stages.begin() + s + 1);
      for (auto [kept, freed] : {std::pair{a + b, 0}, std::pair{a, b}, std::pair{b, a}}) {
        for (int t = -1; t < count - 1; ++t) {
          if (t == s || (freed == 0 && t >= 0)) continue;
          Plan n = merged;
          n.stages[s].replicaCount = kept;
          if (t >= 0) n.stages[t].replicaCount += freed;
          offer(std::move(n));
        }
        if (a == b) break;  // the third share repeats the second
      }
    }
    for (int s = 0; s < count; ++s) {
      const StagePlan& st = p.stages[s];
      const int r = st.replicaCount;
      // Replicas of the two halves: each one unit, half of r, r, or r and the free devices, as
      // long as the two fit in r and the free devices.
      // (the other half also taking what is left of r, or of r and the free devices).
      std::vector<int> counts{unit_, (r / unit_ / 2) * unit_, r - unit_, r, r + free};
      std::vector<std::pair<int, int>> shares;
      for (int a : counts)
        for (int b : counts)
          shares.push_back({a, b});
      for (int a : counts) shares.push_back({a, r - a}), shares.push_back({a, r + free - a});
      std::sort(shares.begin(), shares.end());
      shares.erase(std::unique(shares.begin(), shares.end()), shares.end());
      shares.erase(std::remove_if(shares.begin(), shares.end(),
                                  [&](std::pair<int, int> ab) {
                                    return ab.first < unit_ || ab.second < unit_ ||
                                           ab.first + ab.second > r + free;
                                  }),
                   shares.end());
      // At up to 2 kSpan blocks, spread evenly over the stage.
      const int cuts = st.lastBlock - st.firstBlock;
      const int stride = (cuts + 2 * kSpan - 1) / (2 * kSpan);
      // A neighbouring stage may also give one unit to the halves.
      std::vector<int> givers{-1};
      for (int t : {s - 1, s + 1})
        if (t >= 0 && t < count && p.stages[t].replicaCount > unit_) givers.push_back(t);
      for (int cut = st.firstBlock; cut < st.lastBlock; cut += std::max(1, stride))
        for (int giver : givers)
          for (auto [a, b] : shares) {
            if (giver >= 0) {
              if (a + b + unit_ <= r + free) continue;  // reachable without the giver
              (a < b ? a : b) += unit_;
            }
            Plan n = p;
            if (giver >= 0) n.stages[giver].replicaCount -= unit_;
            n.stages[s].lastBlock = cut;
            n.stages[s].replicaCount = a;
            StagePlan second = st;
            second.firstBlock = cut + 1;
            second.replicaCount = b;
            n.stages.insert(n.stages.begin() + s + 1, second);
            offer(std::move(n));
          }
    }
  }

  // An interleaved plan keeps its positions' ranks: its boundaries move, and its micro-batch
  // count and its (plan-wide) recompute and ZeRO-1 settings change together.
  void interleavedNeighbours(const Plan& p) {
    boundaryNeighbours(p);
    for (int m : microBatches_)
      for (bool recompute : recompute_)
        for (bool zero : zero_) {
          if (zero && p.stages.front().replicaCount == 1) continue;
          Plan n = p;
          n.microBatchCount = m;
          for (StagePlan& s : n.stages) s.recompute = recompute, s.zero = zero;
          offerOne(std::move(n));  // the evaluator refuses counts the interleaved order cannot run
        }
  }

  const CostModel& model_;
  const PlanOptions& options_;
  const int devices_, unit_;
  const double maxWork_;
  const std::vector<bool> recompute_, zero_;  // the options' candidates
  const std::vector<int> microBatches_;
  const std::vector<Schedule> schedules_;
  Refinement result_;
  double best_ = kInf;
  std::optional<Plan> improved_;
  bool collecting_ = false;  // offerOne keeps the round's runners-up
  std::vector<std::pair<double, Plan>> runnersUp_;
};

}  // namespace

double simulatedSeconds(const CostModel& model, const Plan& plan) {
  const PlanEvaluation e = evaluatePlanWith(model, plan, true);
  if (!e.feasible) return kInf;
  if (plan.virtualStages > 1) return e.iterationSeconds;
  std::vector<StageTiming> timings;
  timings.reserve(e.stages.size());
  for (const StageEstimate& s : e.stages)
    timings.push_back({s.forwardSeconds, s.sendForwardSeconds, s.backwardSeconds,
                       s.sendBackwardSeconds, s.allreduceSeconds});
  return simulateTimeline(timings, plan.microBatchCount, plan.schedule).iterationSeconds;
}

Refinement refinePlan(const CostModel& model, const Plan& start, double maxWork) {
  return Climb(model, maxWork).run(start);
}

}  // namespace autostage::decomposer
