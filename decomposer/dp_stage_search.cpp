// The exact DP over the block sequence; see Note [DP search space] in dp_stage_search.h and
// Note [Pipeline cost model] in cost_model.h.
#include "decomposer/dp_stage_search.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "decomposer/baselines.h"
#include "decomposer/cost_model.h"
#include "decomposer/dp_bounds.h"
#include "decomposer/interleaved_search.h"
#include "decomposer/refine.h"
#include "decomposer/request_merge.h"
#include "decomposer/simulator.h"

namespace autostage::decomposer {

int deviceUnit(int devices) {
  int unit = 1;
  while (unit < 8 && devices / unit > 64) unit *= 2;
  while (devices / unit > 64) unit += 8;  // Note [Tensor-parallel units]: a multiple of 8
  return unit;
}

StageShape stageShape(int replicaUnits, int tensorParallel, int unit) {
  const int width = replicaUnits * std::max(1, tensorParallel / unit);
  return {width, width * unit / tensorParallel};
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

// Note [Schedule choice]
// In the cost model gpipe never takes less time than 1f1b (max F' + max B' >= max (F' + B')) and
// never holds fewer activations, so
// with schedule=auto a 1f1b plan is always at least as good: only 1f1b is searched. A forced
// schedule is searched as given, and so is a usage that can run gpipe only (Note [Plan usage]).
std::vector<Schedule> searchedSchedules(const PlanOptions& options) {
  if (options.schedule == "auto" && options.usage == PlanUsage::TrainStep)
    return {Schedule::OneFOneB};
  return options.scheduleCandidates();
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A partial plan for a suffix of the blocks. `previous*` point to the label it extends.
struct Label {
  double sum = 0, maxFirst = 0, maxSecond = 0, maxAllreduce = 0;  // see CostModel::periodParts
  int stages = 0;  // stages in the suffix, capped (see SuffixSearch::kCap_)
  int previousCell = -1, previousLabel = -1;
  int replicaUnits = 0;
  bool recompute = false;
  bool zero = false;
  int tensorParallel = 1;  // its stage spans stageShape(replicaUnits, tensorParallel, unit)
};

// The closed-form incumbent, and every plan offered to it (Note [Finalists]).
struct Best {
  double seconds = kInf;
  Plan plan;
  std::vector<Plan> finalists;
  void offer(double planSeconds, const Plan& candidate) {
    finalists.push_back(candidate);
    if (planSeconds < seconds) seconds = planSeconds, plan = candidate;
  }
};

// Note [Label dominance]
// Two labels of one cell (same first block, same devices used) have the same futures. A is at
// least as good as B for every future when (1) it leaves the earlier stages no more activation to
// hold (fewer stages after them for 1f1b; equal counts when partition_num is forced) and (2)
//   A.sum + (M-1) * (max(0, A.maxFirst - max(B.maxFirst, L1))
//                    + max(0, A.maxSecond - max(B.maxSecond, L2)))
//         + max(0, A.maxAllreduce - B.maxAllreduce) <= B.sum,
// since a future adds the same stages to both, and for x the future's largest part and L a lower
// bound of the plan's largest part (max(b, x) >= L: Note [Prefix bounds], the whole plan's and the
// cell's prefix's), max(a, x) - max(b, x) <= max(0, a - max(b, L)). Without L (L = 0) labels whose
// maxima differ only below what every plan reaches anyway were all kept.
// Note [Fewer label comparisons]
// Most of the search's time goes to offering labels to cells that already hold a label at least
// as good (99.6% of the offers on the 100k-node BERT on 1024 devices). Three shortcuts skip work
// without changing which labels a cell ends up holding, nor their order, so the search's answer
// and finalists stay exactly what they were:
//   - Twins. The passes of one extension (stage settings, recompute outer and zero inner) run in
//     order; an earlier pass with no more recomputation makes, from the same label and first
//     block, a label with the same stages and no larger sum or maxima (ZeRO-1 changes only
//     memory). Dominance is transitive for one cell's floors (each max(0, x - max(y, L)) term
//     obeys the triangle inequality), so a cell that was offered the earlier label holds one
//     dominating the later. So wherever the earlier label fitted in memory, the later one is
//     skipped unoffered: the earlier one was offered, or ruled out by a bound that rules out
//     the later one too, or skipped as the twin of a yet earlier one (then that one is the
//     later one's twin as well). An earlier pass that stopped before a first block (memory or
//     time) made no label there that fitted; its time stop holds for the later pass too. Where
//     a twin fits holding the most micro-batches, the later pass makes no label at all and its
//     stage is not even estimated (it is recorded as not fitting: that twin covers the passes
//     after it); a memory or time stop it skips there holds at the next first block it
//     estimates, as both only grow with the stage.
//   - A bound on the sum alone (the label's maxima left out) is monotone in the label's sum, so
//     it rules out a label before its memory, and every label of the source when it rules out
//     the one with the smallest sum.
//   - Whether some label of a cell dominates a new one does not depend on the order of asking:
//     insert asks the last dominating label first, which settles most offers at once.
// With them (and the baselines' cheaper evaluations, evaluatePlanWith's searchOnly), planning the
// 100k-node BERT on 1024 devices went from 5.19 s to 1.56 s and the 10k-node one from 5.22 s to
// 1.55 s (bench/plan_scaling, side by side on 2 shared cores), with the same plans and finalists
// on every case of the bench.
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
    for (int t : request_.options.tensorParallelCandidates(request_.devicesPerNode))
      if (t <= units_ * unit_) tensorParallel_.push_back(t);
    // A replica-unit count stays when some degree gives its replicas a micro-batch (fewer
    // replicas at a higher degree: Note [Tensor-parallel units]); run() skips the other shapes.
    for (int r : replicaCandidates(units_))
      for (int t : tensorParallel_)
        if (model.microBatchesFit(microBatches, stageShape(r, t, unit_).replicas)) {
          replicas_.push_back(r);
          break;
        }
    cells_.resize(static_cast<size_t>(blocks_ + 1) * (units_ + 1));
    bounds_ = std::make_unique<PrefixBounds>(model, microBatches, schedule, unit_, units_, replicas_,
                                             tensorParallel_, best_.seconds);
    globalFloors_ = {bounds_->maxPart(0, blocks_, units_), bounds_->maxPart(1, blocks_, units_)};
  }

  // Whether this micro-batch count can beat the best plan so far at all.
  bool promising() const {
    return !replicas_.empty() &&
           CostModel::iterationSeconds(bounds_->sum(blocks_, units_), bounds_->max(blocks_, units_), 0,
                                       microBatches_) < best_.seconds;
  }

  void run() {
    cells_[cellIndex(blocks_, 0)].push_back(Label{});
    std::vector<RangeTotals> ranges(blocks_);
    for (int a = blocks_; a > 0; --a) {
      for (int first = 0; first < a; ++first) ranges[first] = model_.ranges().range(first, a - 1);
      members_.clear();
      for (int first = 0; first < a; ++first) members_.emplace_back(model_, ranges[first], first, a - 1);
      for (int u = 0; u <= units_; ++u) {
        const int source = cellIndex(a, u);
        if (cells_[source].empty()) continue;
        const SourceSummary summary = summarise(cells_[source]);
        for (int r : replicas_) {
          if (u + r > units_) break;
          for (int t : tensorParallel_) {
            const Shape shape{r, t, stageShape(r, t, unit_)};
            if (!fitsTensorParallel(u, shape) ||
                !model_.microBatchesFit(microBatches_, shape.size.replicas))
              continue;
            const std::vector<Setting>& settings = settingsOf(shape.size.replicas);
            for (size_t pass = 0; pass < settings.size(); ++pass)
              extend(ranges, source, summary, a, u, shape, settings, pass);
          }
        }
      }
    }
    collect();
  }

 private:
  int cellIndex(int a, int u) const { return a * (units_ + 1) + u; }

  // A stage's replica units and tensor-parallel degree, and what it spans and holds (Note
  // [Tensor-parallel units] in dp_stage_search.h).
  struct Shape {
    int replicas = 1, tensorParallel = 1;
    StageShape size;
    int width() const { return size.units; }
  };

  // Whether a stage of this shape fits after u units, each replica's t ranks on one node (Note
  // [Tensor-parallel cost]): its first rank a multiple of t, which divides the devices per node
  // (tensorParallelCandidates). Always true for t = 1 within the units.
  bool fitsTensorParallel(int u, const Shape& shape) const {
    if (u + shape.width() > units_) return false;
    const int t = shape.tensorParallel;
    return t == 1 || (request_.devices - (u + shape.width()) * unit_) % t == 0;
  }

  // A stage setting the search tries (its recompute and ZeRO-1 flags).
  struct Setting {
    bool recompute = false, zero = false;
  };

  // The settings a stage of `replicas` replicas is searched with, in the candidates' order
  // (recompute outer, zero inner). One replica has nothing to shard: its zero=1 label would equal
  // the zero=0 one, so it is left out when both are candidates and run unsharded when forced.
  const std::vector<Setting>& settingsOf(int replicas) {
    std::vector<Setting>& settings = replicas == 1 ? oneReplicaSettings_ : settings_;
    if (!settings.empty()) return settings;
    for (bool recompute : recomputeCandidates_)
      for (bool zero : zeroCandidates_) {
        if (zero && replicas == 1 && zeroCandidates_.size() > 1) continue;
        settings.push_back({recompute, zero && replicas > 1});
      }
    return settings;
  }

  // What extend needs of a source cell's labels.
  struct SourceSummary {
    int fewestStages = 0, mostStages = 0;
    double smallestSum = kInf;
  };

  SourceSummary summarise(const std::vector<Label>& labels) const {
    SourceSummary s{kCap_, 0, kInf};
    for (const Label& l : labels) {
      s.fewestStages = std::min(s.fewestStages, l.stages);
      s.mostStages = std::max(s.mostStages, l.stages);
      s.smallestSum = std::min(s.smallestSum, l.sum);
    }
    return s;
  }

  // Lower bounds of the two period parts of every plan completing a label of a cell.
  struct PartFloors {
    double first = 0, second = 0;
  };

  PartFloors floorsOf(int first, int unitsUsed) const {
    const int left = units_ - unitsUsed;
    return {std::max(globalFloors_.first, bounds_->maxPart(0, first, left)),
            std::max(globalFloors_.second, bounds_->maxPart(1, first, left))};
  }

  bool dominates(const Label& a, const Label& b, const PartFloors& floors) const {
    if (forcedStages_ > 0 ? a.stages != b.stages : a.stages > b.stages) return false;
    const double period = std::max(0.0, a.maxFirst - std::max(b.maxFirst, floors.first)) +
                          std::max(0.0, a.maxSecond - std::max(b.maxSecond, floors.second));
    return a.sum + (microBatches_ - 1) * period + std::max(0.0, a.maxAllreduce - b.maxAllreduce) <= b.sum;
  }

  // Adds `label` to `cell` unless a label there dominates it, removing the labels it dominates.
  // Whether one dominates is the same in any order: the last label found dominating (the
  // previous insert's, usually into the same cell from the next label of the same source) is
  // asked first, which settles most inserts in one comparison (Note [Fewer label comparisons]).
  void insert(std::vector<Label>& cell, const Label& label, const PartFloors& floors) {
    if (dominator_ < cell.size() && dominates(cell[dominator_], label, floors)) return;
    for (size_t i = 0; i < cell.size(); ++i)
      if (dominates(cell[i], label, floors)) {
        dominator_ = i;
        return;
      }
    cell.erase(std::remove_if(cell.begin(), cell.end(),
                              [&](const Label& l) { return dominates(label, l, floors); }),
               cell.end());
    cell.push_back(label);
  }

  // Prepends stages [first, a-1] for every first < a, with r units and setting settings[pass],
  // to the labels of `source`; the passes run in order, and a label an earlier pass covers is
  // skipped (Note [Fewer label comparisons]). `zero` candidates come false first: an equal-cost
  // zero=1 label is dominated by the zero=0 one, so ZeRO-1 survives only where it is needed to
  // fit (Note [ZeRO-1 cost] in cost_model.cpp).
  // A shape of tensor-parallel degree t > 1 is searched like another replica count: its passes
  // are twins of one another only (Note [Tensor-parallel cost]).
  void extend(const std::vector<RangeTotals>& ranges, int source, const SourceSummary& summary,
              int a, int u, Shape shape, const std::vector<Setting>& settings, size_t pass) {
    const int r = shape.replicas, t = shape.tensorParallel, width = shape.width();
    const std::vector<Label>& labels = cells_[source];
    const bool recompute = settings[pass].recompute, zero = settings[pass].zero;
    // The earlier passes whose labels are never slower than this one's: the same recompute
    // flag (equal times) or none where this one recomputes.
    twins_.clear();
    for (size_t q = 0; q < pass; ++q)
      if (settings[q].recompute <= recompute) twins_.push_back(q);
    std::vector<MemoryShape>& memory = passMemory_[pass];
    memory.resize(blocks_);
    reachedFrom_[pass] = a;  // the pass has reached no first block yet
    const int firstRank = request_.devices - (u + width) * unit_;
    const double limit = model_.memoryLimit();
    const double globalMaxBound = bounds_->max(blocks_, units_);
    const int mostHeld = model_.heldMicroBatches(schedule_, microBatches_, summary.mostStages);
    for (int first = a - 1; first >= 0; --first) {
      // A twin holding even the most micro-batches in memory covers every label: no need for
      // this pass's stage here (Note [Fewer label comparisons]: a stop it skips holds below).
      if (coveredByTwin(first, mostHeld, limit)) {
        memory[first] = MemoryShape{};
        reachedFrom_[pass] = first;
        continue;
      }
      StageChoice choice{first, a - 1, shape.size.replicas, firstRank, recompute,
                         summary.fewestStages, zero, t};
      StageEstimate e = model_.stage(members_[first].get(t, false), choice, microBatches_,
                                     schedule_);
      // Parameters, activations and working memory only grow as the stage grows, and so does its
      // compute time: stop when either rules out every label. At t > 1, of their lower bound
      // (Note [Tensor-parallel stops] in cost_model.cpp).
      const auto stops = [&](const StageEstimate& low) {
        const double growing = low.totalMemoryBytes - low.commBufferBytes -
                               (recompute ? low.heldMicroBatches * low.bytesPerHeldMicroBatch : 0);
        const double compute = low.forwardSeconds + low.backwardSeconds;
        return growing > limit ||
               summary.smallestSum + (microBatches_ - 1) * compute >= best_.seconds;
      };
      // The bound is below e in both, so it can stop only where e does: asked only then.
      if (stops(e) && (t == 1 || stops(model_.stage(members_[first].get(t, true), choice,
                                                    microBatches_, schedule_))))
        break;
      memory[first] = {e.baseMemoryBytes, e.bytesPerHeldMicroBatch};
      reachedFrom_[pass] = first;
      const int target = cellIndex(first, u + width);
      const std::pair<double, double> parts = CostModel::periodParts(e, schedule_);
      const double prefixSum = bounds_->sum(first, units_ - u - width);
      const double prefixMax = std::max(globalMaxBound, bounds_->max(first, units_ - u - width));
      if (prefixSum == kInf) continue;
      const PartFloors floors = floorsOf(first, u + width);
      // The bound below with the label's own maxima left out: no larger than its bound, and
      // growing with the label's sum alone, so it rules labels out before anything else is
      // looked at, and all of them when it rules out the one of the smallest sum.
      const double smallestPeriod = std::max(
          std::max(parts.first, floors.first) + std::max(parts.second, floors.second), prefixMax);
      const auto sumBound = [&](double sum) {
        return CostModel::iterationSeconds(sum + e.stageSeconds + prefixSum, smallestPeriod,
                                           e.allreduceSeconds, microBatches_);
      };
      if (sumBound(summary.smallestSum) >= best_.seconds) continue;
      for (size_t i = 0; i < labels.size(); ++i) {
        const Label& from = labels[i];
        if (sumBound(from.sum) >= best_.seconds) continue;
        const int held = model_.heldMicroBatches(schedule_, microBatches_, from.stages);
        if (e.baseMemoryBytes + held * e.bytesPerHeldMicroBatch > limit) continue;
        if (coveredByTwin(first, held, limit)) continue;
        Label next{from.sum + e.stageSeconds, std::max(from.maxFirst, parts.first),
                   std::max(from.maxSecond, parts.second), std::max(from.maxAllreduce, e.allreduceSeconds),
                   std::min(from.stages + 1, kCap_), source, static_cast<int>(i), r, recompute, zero,
                   t};
        if (forcedStages_ > 0 && from.stages + 1 > forcedStages_) continue;
        const double period = std::max(std::max(next.maxFirst, floors.first) +
                                           std::max(next.maxSecond, floors.second),
                                       prefixMax);
        const double bound =
            CostModel::iterationSeconds(next.sum + prefixSum, period, next.maxAllreduce, microBatches_);
        if (bound >= best_.seconds) continue;
        insert(cells_[target], next, floors);
      }
    }
  }

  // Whether a twin pass (twins_) made a label at `first` holding `held` micro-batches that fits:
  // the same test as that pass's (a first it did not reach has no fitting label).
  bool coveredByTwin(int first, int held, double limit) const {
    for (size_t q : twins_) {
      if (first < reachedFrom_[q]) continue;  // no label there
      const MemoryShape& m = passMemory_[q][first];
      if (!(m.base + held * m.perHeld > limit)) return true;
    }
    return false;
  }

  // Offers every complete plan that beats the incumbent of the search's start (all complete
  // labels passed its bound; Note [Finalists]).
  void collect() {
    const double incumbent = best_.seconds;
    for (int u = 1; u <= units_; ++u) {
      const int cell = cellIndex(0, u);
      for (size_t i = 0; i < cells_[cell].size(); ++i) {
        const Label& l = cells_[cell][i];
        if (forcedStages_ > 0 && l.stages != forcedStages_) continue;
        double seconds = CostModel::iterationSeconds(l.sum, l.maxFirst + l.maxSecond, l.maxAllreduce, microBatches_);
        if (seconds < incumbent) best_.offer(seconds, reconstruct(cell, static_cast<int>(i)));
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
      const int sourceBlock = l.previousCell / (units_ + 1);
      plan.stages.push_back({block, sourceBlock - 1,
                             stageShape(l.replicaUnits, l.tensorParallel, unit_).replicas, 0,
                             l.recompute, l.zero,
                             l.tensorParallel});
      block = sourceBlock;
      cell = l.previousCell;
      label = l.previousLabel;
    }
    int rank = request_.devices;
    for (const StagePlan& s : plan.stages) rank -= s.rankCount();
    for (StagePlan& s : plan.stages) s.firstRank = rank, rank += s.rankCount();
    return plan;
  }

  const CostModel& model_;
  const PlanRequest& request_;
  const int microBatches_;
  const Schedule schedule_;
  Best& best_;
  int blocks_ = 0, unit_ = 1, units_ = 1, forcedStages_ = 0, kCap_ = 0;
  std::vector<int> replicas_;
  std::vector<int> tensorParallel_;  // degrees searched, ascending (Note [Tensor-parallel cost])
  const std::vector<bool> recomputeCandidates_ = request_.options.recomputeCandidates();
  const std::vector<bool> zeroCandidates_ = request_.options.zeroCandidates();
  std::vector<std::vector<Label>> cells_;
  std::vector<Setting> settings_, oneReplicaSettings_;  // settingsOf's, made on first use
  // A pass's stage memory at a first block: base + held micro-batches * perHeld.
  struct MemoryShape {
    double base = kInf, perHeld = 0;
  };
  std::vector<MemoryShape> passMemory_[4];  // per pass of the current extension (<= 4 settings)
  int reachedFrom_[4] = {};                 // each pass's lowest first block (valid from there)
  std::vector<size_t> twins_;               // the current pass's earlier passes covering it
  size_t dominator_ = 0;                    // insert's last dominating label
  std::unique_ptr<PrefixBounds> bounds_;  // Note [Prefix bounds] in dp_bounds.h
  // Blocks [first, a - 1] as a rank of each degree holds them, per first block, while the search
  // extends to block a (run()): the replica counts and settings tried there share them.
  std::vector<MemberRanges> members_;
  PartFloors globalFloors_;               // of the whole plan
};

// The best baseline plan, moved onto the DP's rank layout (ending at the last rank), as the first
// incumbent: the search then only keeps partial plans that can beat it.
Best seedFromBaselines(const PlanRequest& request, const CostModel& model) {
  Best best;
  for (Plan& plan : seedBaselines(request)) {
    int rank = request.devices;
    for (const StagePlan& s : plan.stages) rank -= s.rankCount();
    for (StagePlan& s : plan.stages) s.firstRank = rank, rank += s.rankCount();
    PlanEvaluation e = evaluatePlanWith(model, plan, true);
    if (e.feasible) best.offer(e.searchSeconds, plan);
  }
  return best;
}

// Runs the search for every micro-batch count and schedule, improving `best`; with `phases`,
// records the time of each.
void searchAll(const CostModel& model, Best& best, bool logProgress,
               std::vector<std::pair<std::string, double>>* phases = nullptr) {
  const PlanOptions& options = model.request().options;
  auto log = core::logger("DPStaging");
  auto start = std::chrono::steady_clock::now();
  // Large micro-batch counts first: they usually win, and a good incumbent prunes the rest.
  std::vector<int> microBatchCounts = options.microBatchCandidates(model.request().batchSize);
  std::reverse(microBatchCounts.begin(), microBatchCounts.end());
  for (int microBatches : microBatchCounts) {
    for (Schedule schedule : searchedSchedules(options)) {
      const auto searchStart = std::chrono::steady_clock::now();
      SuffixSearch search(model, microBatches, schedule, best);
      const bool promising = search.promising();
      if (promising) search.run();
      const auto now = std::chrono::steady_clock::now();
      const double took = std::chrono::duration<double>(now - searchStart).count();
      if (phases)
        phases->emplace_back(fmt::format("dp pipeline={} schedule={}{}", microBatches,
                                         scheduleName(schedule),
                                         promising ? "" : " (bound: skipped)"),
                             took);
      const double elapsed = std::chrono::duration<double>(now - start).count();
      if (logProgress && elapsed > 2.0)
        log->info("Searching: pipeline={} schedule={} took {:.1f} s{} ({:.1f} s in all), best so "
                  "far {:.6f} s",
                  microBatches, scheduleName(schedule), took,
                  promising ? "" : " (ruled out by its bound)", elapsed, best.seconds);
    }
  }
}

// Note [First plan]
// The search prunes with the best plan found so far, so a good first plan makes it much faster.
// It comes from the baselines, then from the same search over the request merged to 32, 64, ...
// blocks (a plan of a merged request is a plan of the full one), each level seeding the next; the
// full search then only keeps partial plans that can beat it, and stays exact.
constexpr int kFirstMergedBlocks = 32;

Best firstPlan(const PlanRequest& request, const CostModel& model) {
  Best best = seedFromBaselines(request, model);
  const int blocks = static_cast<int>(request.blocks.size());
  for (int level = kFirstMergedBlocks; 2 * level <= blocks; level *= 2) {
    MergedRequest merged = mergeRequestBlocks(request, level);
    CostModel mergedModel(merged.request);
    Best coarse;
    if (best.seconds < kInf) {  // carry the incumbent's value; its plan may not fit this level
      coarse.seconds = best.seconds;
    }
    searchAll(mergedModel, coarse, false);
    if (coarse.plan.stages.empty()) continue;
    Plan plan = expandPlan(merged, coarse.plan);
    PlanEvaluation e = evaluatePlanWith(model, plan, true);
    if (e.feasible) best.offer(e.searchSeconds, plan);
  }
  return best;
}

// The refinement's phase name: what it evaluated and found.
std::string describe(const Refinement& r) {
  return fmt::format("refinement ({} neighbours, {} moves{})", r.evaluations, r.moves,
                     r.exhausted ? ", stopped at the budget" : "");
}

// Finalists the refinement starts from (the fastest, simulated; Note [Simulated refinement]).
constexpr size_t kRefineStarts = 4;

// Sets what every plan the DP returns carries (dp_stage_search.h).
void finishPlan(const CostModel& model, Plan& plan) {
  const PlanEvaluation e = evaluatePlanWith(model, plan);
  plan.decomposer = "dp";
  plan.searchSeconds = e.searchSeconds;
  plan.predictedSeconds = e.iterationSeconds;
}

}  // namespace

namespace {

// searchDynamicProgramming without the message: nullopt when no plan fits (the interleaved
// search may still find one, and infeasibleMessage costs seconds on 16k devices). Appends the
// phases to `phases`, also when nothing fits.
std::optional<DpSearchResult> searchPlain(const CostModel& model,
                                          std::vector<std::pair<std::string, double>>& phases) {
  PhaseClock clock(phases);
  Best best = firstPlan(model.request(), model);
  clock.mark("first plan (baselines, merged blocks)");
  searchAll(model, best, true, &phases);
  if (best.seconds == kInf) return std::nullopt;
  DpSearchResult result{std::move(best.plan), std::move(best.finalists)};
  result.best.phaseSeconds = phases;
  finishPlan(model, result.best);
  for (Plan& plan : result.finalists) finishPlan(model, plan);
  return result;
}

}  // namespace

DpSearchResult searchDynamicProgramming(const PlanRequest& request) {
  request.validate();
  CostModel model(request);
  std::vector<std::pair<std::string, double>> phases;
  std::optional<DpSearchResult> result = searchPlain(model, phases);
  AUTOSTAGE_CHECK_AS(PlanError, result.has_value(), infeasibleMessage(request));
  return std::move(*result);
}

// Note [Interleaved search] (interleaved_search.h): the plain plan (v = 1) is the DP's
// simulated-fastest finalist; each v > 1 the options allow offers its best interleaved plan, which
// replaces it only when it simulates faster.
Plan planDynamicProgramming(const PlanRequest& request) {
  request.validate();
  const std::vector<int> virtualStages = request.options.virtualStageCandidates();
  CostModel model(request);
  std::vector<std::pair<std::string, double>> phases;
  std::optional<Plan> chosen;
  double chosenSeconds = kInf;
  bool plainFits = true;  // false when the plain search found no plan that fits
  if (std::find(virtualStages.begin(), virtualStages.end(), 1) != virtualStages.end()) {
    std::optional<DpSearchResult> search = searchPlain(model, phases);
    if (!search) {
      AUTOSTAGE_CHECK_AS(PlanError, virtualStages.size() > 1, infeasibleMessage(request));
      plainFits = false;
    } else {
      PhaseClock clock(phases);
      // Note [Simulated refinement]: the fastest finalists, simulated, are the climbs' starts.
      std::vector<std::pair<double, Plan>> starts{
          {simulatedSeconds(model, search->best), search->best}};
      for (const Plan& plan : search->finalists)
        starts.emplace_back(simulatedSeconds(model, plan), plan);
      std::stable_sort(starts.begin(), starts.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      starts.erase(std::unique(starts.begin(), starts.end(),
                               [](const auto& a, const auto& b) {
                                 return a.second.stages == b.second.stages &&
                                        a.second.microBatchCount == b.second.microBatchCount &&
                                        a.second.schedule == b.second.schedule;
                               }),
                   starts.end());
      chosen = starts.front().second;
      chosenSeconds = starts.front().first;
      clock.mark(fmt::format("finalists simulated ({})", search->finalists.size()));
      double budget = kRefineWork;
      for (size_t i = 0; i < starts.size() && i < kRefineStarts && budget > 0; ++i) {
        const Refinement refined = refinePlan(model, starts[i].second, budget);
        budget -= refined.work;
        clock.mark(fmt::format("from finalist {}: {}", i + 1, describe(refined)));
        if (refined.seconds < chosenSeconds * (1 - 1e-12)) {
          chosen = refined.plan;
          chosenSeconds = refined.seconds;
          finishPlan(model, *chosen);
        }
      }
    }
  }
  auto log = core::logger("DPStaging");
  for (int v : virtualStages) {
    if (v == 1) continue;
    PhaseClock clock(phases);
    Refinement refined;
    std::optional<Plan> interleaved = searchInterleaved(model, v, &refined);
    clock.mark(fmt::format("interleaved v={}: family and {}", v, describe(refined)));
    if (!interleaved) {
      log->debug("Interleaved 1f1b v={}: no plan fits", v);
      continue;
    }

    const double seconds = interleaved->predictedSeconds;
    if (chosen && seconds >= chosenSeconds * (1 - 1e-9)) {
      log->debug("Interleaved 1f1b v={} simulates {:.3f} ms, not faster than {:.3f} ms: not chosen",
                v, seconds * 1e3, chosenSeconds * 1e3);
      continue;
    }
    if (chosen)
      log->info("Interleaved 1f1b v={} simulates {:.3f} ms against {:.3f} ms ({}): chosen", v,
                seconds * 1e3, chosenSeconds * 1e3,
                chosen->virtualStages > 1 ? "v=" + std::to_string(chosen->virtualStages)
                                          : "without interleaving");
    else
      log->info("Interleaved 1f1b v={} simulates {:.3f} ms: chosen", v, seconds * 1e3);
    chosen = interleaved;
    chosenSeconds = seconds;
  }
  if (!chosen) {
    AUTOSTAGE_CHECK_AS(PlanError, plainFits, infeasibleMessage(request));
    throw PlanError("no interleaved plan (virtual_stages=" + request.options.virtualStages +
                    ") fits: " + infeasibleMessage(request) +
                    "; interleaving also needs a stage count dividing the devices and a "
                    "micro-batch count that is a multiple of it; try virtual_stages=auto or 1");
  }
  chosen->phaseSeconds = std::move(phases);
  return *chosen;
}

}  // namespace autostage::decomposer
