// PrefixBounds: two label-free DPs over (blocks placed, units available); see dp_bounds.h.
#include "decomposer/dp_bounds.h"

#include <algorithm>
#include <limits>

namespace autostage::decomposer {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The faster of the intra- and inter-node links, for sends whose placement is not known yet.
core::LinkCost fasterLink(const core::LinkCost& a, const core::LinkCost& b) {
  return {std::min(a.latencySeconds, b.latencySeconds), std::max(a.bytesPerSecond, b.bytesPerSecond)};
}

// Compute plus send time of stage [first, last] with r devices over the faster link, or infinity
// when it cannot fit in memory even recomputed and holding the fewest micro-batches; sets `stop`
// when no longer stage can fit.
double frugalStageTime(const CostModel& model, const RangeTotals& range, int first, int last, int r,
                       int microBatches, Schedule schedule, bool* stop) {
  double best = kInf, growing = kInf;
  for (bool recompute : model.request().options.recomputeCandidates()) {
    // The smallest memory the options allow: ZeRO-1 when it may be chosen.
    StageChoice choice{first, last, r, 0, recompute, 0, model.request().options.zeroCandidates().back()};
    StageEstimate e = model.stage(range, choice, microBatches, schedule);
    growing = std::min(growing, e.totalMemoryBytes - e.commBufferBytes -
                                    (recompute ? e.heldMicroBatches * e.bytesPerHeldMicroBatch : 0));
    if (e.totalMemoryBytes > model.memoryLimit()) continue;
    const core::CommProfile& comm = model.request().comm;
    const core::LinkCost link = fasterLink(comm.p2pIntraNode, comm.p2pInterNode);
    const double mb = static_cast<double>(e.microBatchPerReplica);
    best = std::min(best, range.forwardSeconds.at(mb) + range.backwardSeconds.at(mb) +
                              link.seconds(e.outputBytes) + link.seconds(e.inputBytes));
  }
  *stop = growing > model.memoryLimit();
  return best;
}

}  // namespace

PrefixBounds::PrefixBounds(const CostModel& model, int microBatches, Schedule schedule, int unit,
                           int units, const std::vector<int>& replicaUnits)
    : units_(units) {
  const int n = model.ranges().blockCount();
  sum_.assign(static_cast<size_t>(n + 1) * (units + 1), kInf);
  max_.assign(sum_.size(), kInf);
  for (int u = 0; u <= units; ++u) sum_[index(0, u)] = max_[index(0, u)] = 0;
  std::vector<bool> open(replicaUnits.size());
  for (int a = 1; a <= n; ++a) {
    std::fill(open.begin(), open.end(), true);
    for (int first = a - 1; first >= 0; --first) {
      RangeTotals range = model.ranges().range(first, a - 1);
      for (size_t i = 0; i < replicaUnits.size(); ++i) {
        if (!open[i]) continue;
        const int r = replicaUnits[i];
        bool stop = false;
        const double t = frugalStageTime(model, range, first, a - 1, r * unit, microBatches, schedule, &stop);
        if (stop) open[i] = false;
        if (t == kInf) continue;
        for (int u = r; u <= units; ++u) {
          const size_t from = index(first, u - r), to = index(a, u);
          sum_[to] = std::min(sum_[to], sum_[from] + t);
          max_[to] = std::min(max_[to], std::max(max_[from], t));
        }
      }
    }
    for (int u = 1; u <= units; ++u) {  // more units never hurt
      sum_[index(a, u)] = std::min(sum_[index(a, u)], sum_[index(a, u - 1)]);
      max_[index(a, u)] = std::min(max_[index(a, u)], max_[index(a, u - 1)]);
    }
  }
}

}  // namespace autostage::decomposer
