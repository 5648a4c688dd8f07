#pragma once
// The search over interleaved 1f1b plans (virtual stages), beside the DP's one-stage-per-rank
// search (dp_stage_search.h).
//
// Note [Interleaved search]
// A plan with v > 1 virtual stages runs S = stages / v pipeline positions, stage k on the ranks
// of stage k mod S, in Megatron's interleaved order (Note [Pipeline schedules] in
// core/pipeline_schedule.h). Its time and memory come from simulating that order (Note
// [Interleaved evaluation] in evaluate.cpp), which no DP label summarises, so it is searched in a
// smaller family where every candidate is simulated:
//   - every stage has one tensor-parallel degree t of the option's candidates (Note
//     [Tensor-parallel cost]; 1 unless tensor_parallel allows more), S t divides the device count
//     (S = 2 .. min(devices / t, blocks / v)) and every position has r = devices / (S t)
//     replicas of t ranks (with partition_num set: S v = partition_num);
//   - M is a micro-batch candidate that is a multiple of S with M r <= batch;
//   - the blocks are cut into S v contiguous chunks minimising the largest chunk's compute time
//     (forward + backward at the per-replica micro-batch on one rank of degree t, a pattern
//     spanning blocks counted whole; binary search on that time with a greedy cut, exact for
//     min-max contiguous partitions);
//   - recompute and zero are chosen for all stages alike, over their candidates;
// and the family's fastest plan is then refined by simulation (Note [Simulated refinement]).
// The fastest feasible candidate per v competes with the DP's plan (v = 1) by simulated iteration
// time and replaces it only when faster (planDynamicProgramming; the log says which won and by
// how much). The family is small (for 32 devices: 5 depths x up to 6 micro-batch counts x 4, per
// degree), so the search adds milliseconds. It is not exact: uneven replica counts per position and
// per-stage recompute/zero are not tried with interleaving.

#include <optional>

#include "decomposer/cost_model.h"
#include "decomposer/plan.h"
#include "decomposer/refine.h"

namespace autostage::decomposer {

// Whether `positions` pipeline positions of groups of t ranks make an interleaved plan on
// `devices` (the family above: at least 2 positions, their groups dividing the devices).
bool positionsTile(int devices, int positions, int t);

// The fastest feasible interleaved plan with `virtualStages` (>= 2) stages per position, refined
// (Note [Simulated refinement]), with predictedSeconds and searchSeconds set to its simulated
// iteration; nullopt when none fits. `refinement`, when given, receives the refinement's counts.
std::optional<Plan> searchInterleaved(const CostModel& model, int virtualStages,
                                      Refinement* refinement = nullptr);

// Cuts blocks 0..n-1 into `parts` contiguous non-empty ranges minimising the largest sum of
// `cost` (per block); requires 1 <= parts <= n. Pure.
std::vector<std::pair<int, int>> minMaxCuts(const std::vector<double>& cost, int parts);

}  // namespace autostage::decomposer
