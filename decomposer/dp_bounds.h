#pragma once
// Lower bounds that let the DP stage search prune (Note [Prefix bounds]).
//
// For blocks [0, a) placed on at most `units` device units, over every split into stages with
// replica counts from the search's candidates that fit in memory in their most frugal setting:
//   sum(a, units): the smallest summed time of the stages,
//   max(a, units): the smallest time of the slowest stage,
//   maxPart(k, a, units): the smallest largest k-th part of a stage's time, the parts whose
//                         maxima add up to the period (CostModel::periodParts: for 1f1b the
//                         stage time and 0, for gpipe forward + send and backward + send),
// where a stage's time counts its compute and its sends over the faster of the two links. Each is
// minimised on its own, so each bounds every real plan from below.
//
// Given the search's incumbent (the closed-form seconds of the best plan so far), a stage whose
// compute alone, run M times, reaches it is left out: every plan holding it is at least that slow
// (CostModel::iterationSeconds: its stage time in the sum, and M - 1 periods of at least that
// time, or of its forward and backward parts for gpipe), so the bounds still hold for every plan
// that can beat the incumbent, the only plans the search keeps. A stage's compute only grows with
// the stage (at t > 1 its lower bound's: Note [Tensor-parallel stops] in cost_model.cpp), so a
// shape stops growing there, as at the memory limit.

#include <limits>
#include <vector>

#include "decomposer/cost_model.h"

namespace autostage::decomposer {

class PrefixBounds {
 public:
  // `replicaUnits` ascending; a replica count is replicaUnits[i] * unit devices. A stage of r
  // replica units at tensor-parallel degree t (from `tensorParallel`) spans stageShape(r, t,
  // unit) (Note [Tensor-parallel units] in dp_stage_search.h).
  PrefixBounds(const CostModel& model, int microBatches, Schedule schedule, int unit, int units,
               const std::vector<int>& replicaUnits, const std::vector<int>& tensorParallel,
               double incumbent = std::numeric_limits<double>::infinity());
  double sum(int blocks, int units) const { return sum_[index(blocks, units)]; }
  double max(int blocks, int units) const { return max_[index(blocks, units)]; }
  double maxPart(int part, int blocks, int units) const {
    return maxPart_[part][index(blocks, units)];
  }

 private:
  size_t index(int blocks, int units) const { return static_cast<size_t>(blocks) * (units_ + 1) + units; }
  int units_;
  std::vector<double> sum_, max_;
  std::vector<double> maxPart_[2];
};

}  // namespace autostage::decomposer
