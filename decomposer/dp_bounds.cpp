// PrefixBounds: two label-free DPs over (blocks placed, units available); see dp_bounds.h.
#include "decomposer/dp_bounds.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "decomposer/dp_stage_search.h"

namespace autostage::decomposer {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The faster of the intra- and inter-node links, for sends whose placement is not known yet.
core::LinkCost fasterLink(const core::LinkCost& a, const core::LinkCost& b) {
  return {std::min(a.latencySeconds, b.latencySeconds), std::max(a.bytesPerSecond, b.bytesPerSecond)};
}

// A stage's time and its two period parts (CostModel::periodParts), bounded from below.
struct FrugalTimes {
  double total = kInf;
  double parts[2] = {kInf, kInf};
};

// Compute plus send times of stage [first, last] with r devices over the faster link, or infinity
// when it cannot fit in memory even recomputed and holding the fewest micro-batches; sets `stop`
// when no longer stage can fit or beat `incumbent` (Note [Prefix bounds]).
FrugalTimes frugalStageTime(const CostModel& model, MemberRanges& members, int first, int last,
                            int r, int t, int microBatches, Schedule schedule,
                            const std::vector<bool>& recomputeCandidates, bool zero,
                            double incumbent, bool* stop) {
  FrugalTimes best;
  double growing = kInf;
  bool slow = true;  // every setting's compute, run M times, reaches the incumbent
  const bool inference = model.request().options.usage == PlanUsage::Inference;
  for (bool recompute : recomputeCandidates) {
    // The smallest memory the options allow: ZeRO-1 when it may be chosen (`zero`).
    StageChoice choice{first, last, r, 0, recompute, 0, zero, t};
    StageEstimate e = model.stage(members.get(t, false), choice, microBatches, schedule);
    // Note [Tensor-parallel stops] (cost_model.cpp): at t > 1 the stop uses a lower bound.
    const auto growth = [&](const StageEstimate& low) {
      return low.totalMemoryBytes - low.commBufferBytes -
             (recompute ? low.heldMicroBatches * low.bytesPerHeldMicroBatch : 0);
    };
    const auto compute = [&](const StageEstimate& low) {
      return low.forwardSeconds + (inference ? 0.0 : low.backwardSeconds);
    };
    const auto tooSlow = [&](const StageEstimate& low) {
      return microBatches * compute(low) >= incumbent;
    };
    // The bound is below e, so it matters only where e grows past the limit or reaches the
    // incumbent: asked only then.
    double grows = growth(e);
    bool settingSlow = tooSlow(e);
    if (t > 1 && (grows > model.memoryLimit() || settingSlow)) {
      const StageEstimate low = model.stage(members.get(t, true), choice, microBatches, schedule);
      grows = growth(low);
      settingSlow = tooSlow(low);
    }
    growing = std::min(growing, grows);
    slow = slow && settingSlow;
    const bool fits = e.totalMemoryBytes <= model.memoryLimit();
    // Too slow by the bound (which leaves out the all-reduces and so any placement's) is too
    // slow for this stage wherever it is placed.
    if (fits && !settingSlow) {
      const core::CommProfile& comm = model.request().comm;
      const core::LinkCost link = fasterLink(comm.p2pIntraNode, comm.p2pInterNode);
      // The estimate's own compute times (recomputation included only when it is chosen, none
      // backward for inference: Note [Plan usage]); the sends over the faster link.
      const double forward = e.forwardSeconds + link.seconds(e.outputBytes);
      const double backward = inference ? 0.0 : e.backwardSeconds + link.seconds(e.inputBytes);
      best.total = std::min(best.total, forward + backward);
      const bool split = schedule == Schedule::GPipe;
      best.parts[0] = std::min(best.parts[0], split ? forward : forward + backward);
      best.parts[1] = std::min(best.parts[1], split ? backward : 0.0);
    }
    // Note [Bounds without recomputation]
    // Recomputing adds a forward to the backward and keeps the sends: where the stage fits
    // without it (the candidates put false first), its recomputed setting is no faster in any
    // figure above, nor faster to compute (so slow where this one is), and the memory stop cannot
    // hold (this setting's growth is within the limit). It adds nothing and is not estimated.
    if (!recompute && fits) break;
  }
  *stop = growing > model.memoryLimit() || slow;
  return best;
}

// to[i] = min(to[i], f(from[i])) for i < count; the rows do not overlap.
template <typename F>
void relaxRow(const double* __restrict from, double* __restrict to, size_t count, F f) {
  for (size_t i = 0; i < count; ++i) to[i] = std::min(to[i], f(from[i]));
}

}  // namespace

PrefixBounds::PrefixBounds(const CostModel& model, int microBatches, Schedule schedule, int unit,
                           int units, const std::vector<int>& replicaUnits,
                           const std::vector<int>& tensorParallel, double incumbent)
    : units_(units) {
  const int n = model.ranges().blockCount();
  sum_.assign(static_cast<size_t>(n + 1) * (units + 1), kInf);
  max_.assign(sum_.size(), kInf);
  for (auto& part : maxPart_) part.assign(sum_.size(), kInf);
  for (int u = 0; u <= units; ++u)
    sum_[index(0, u)] = max_[index(0, u)] = maxPart_[0][index(0, u)] = maxPart_[1][index(0, u)] = 0;
  // Stage shapes (Note [Tensor-parallel units]) that fit the units and the micro-batches.
  struct Shape {
    int degree;
    StageShape size;
  };
  std::vector<Shape> shapes;
  for (int r : replicaUnits)
    for (int t : tensorParallel) {
      const StageShape size = stageShape(r, t, unit);
      if (size.units <= units && model.microBatchesFit(microBatches, size.replicas))
        shapes.push_back({t, size});
    }
  std::vector<bool> open(shapes.size());
  const std::vector<bool> recompute = model.request().options.recomputeCandidates();
  const bool zero = model.request().options.zeroCandidates().back();
  // Shapes of one width relax the same cells: each (first, a) keeps the least of their times per
  // width (the least total and the least of each part, as sum, max and maxPart each take a
  // minimum over shapes of a function increasing in the stage's figure), then relaxes every
  // width once (tensor-parallel degrees give several shapes of one width).
  std::vector<FrugalTimes> byWidth(units + 1);
  std::vector<int> widths;
  for (int a = 1; a <= n; ++a) {
    std::fill(open.begin(), open.end(), true);
    for (int first = a - 1; first >= 0; --first) {
      const RangeTotals range = model.ranges().range(first, a - 1);
      MemberRanges members(model, range, first, a - 1);
      widths.clear();
      for (size_t i = 0; i < shapes.size(); ++i) {
        if (!open[i]) continue;
        const int degree = shapes[i].degree, width = shapes[i].size.units;
        bool stop = false;
        const FrugalTimes t =
            frugalStageTime(model, members, first, a - 1, shapes[i].size.replicas, degree,
                            microBatches, schedule, recompute, zero, incumbent, &stop);
        if (stop) open[i] = false;
        if (t.total == kInf) continue;
        FrugalTimes& least = byWidth[width];
        if (least.total == kInf) widths.push_back(width);  // the first shape of this width
        least.total = std::min(least.total, t.total);
        for (int k = 0; k < 2; ++k) least.parts[k] = std::min(least.parts[k], t.parts[k]);
      }
      for (int width : widths) {
        const FrugalTimes t = byWidth[width];
        byWidth[width] = FrugalTimes{};
        // Row `first` shifted by the width into row `a` (a > first: the rows do not overlap),
        // one array at a time so that each loop vectorizes.
        const size_t from = index(first, 0), to = index(a, width), count = units + 1 - width;
        relaxRow(sum_.data() + from, sum_.data() + to, count,
                 [&](double x) { return x + t.total; });
        relaxRow(max_.data() + from, max_.data() + to, count,
                 [&](double x) { return std::max(x, t.total); });
        for (int k = 0; k < 2; ++k)
          relaxRow(maxPart_[k].data() + from, maxPart_[k].data() + to, count,
                   [&](double x) { return std::max(x, t.parts[k]); });
      }
    }
    for (int u = 1; u <= units; ++u) {  // more units never hurt
      sum_[index(a, u)] = std::min(sum_[index(a, u)], sum_[index(a, u - 1)]);
      max_[index(a, u)] = std::min(max_[index(a, u)], max_[index(a, u - 1)]);
      for (auto& part : maxPart_)
        part[index(a, u)] = std::min(part[index(a, u)], part[index(a, u - 1)]);
    }
  }
}

}  // namespace autostage::decomposer
