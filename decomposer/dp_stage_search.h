#pragma once
// Exact dynamic-programming stage search over the block sequence (decomposer = dp).
//
// Search space (Note [DP search space]): every split of the blocks into contiguous stages; per
// stage a replica count from replicaCandidates() (in device units, see deviceUnit()) and a
// recompute flag; micro-batch counts from PlanOptions::microBatchCandidates(); schedules from
// PlanOptions::scheduleCandidates(); stages laid out on ascending contiguous rank ranges ending at
// the last rank. The objective is CostModel's iteration time, under its memory limit. The search
// is exact over this space: it keeps, per (first block of the suffix, devices used, stages after),
// every partial plan not dominated in (sum of stage times, max stage time, max allreduce time).

#include <vector>

#include "decomposer/plan.h"

namespace autostage::decomposer {

// Devices per replica unit: 1 up to 64 devices, else the smallest power of two that brings the
// unit count to <= 64 (replica counts are multiples of it).
int deviceUnit(int devices);
// Replica counts (in units) the search tries for `units` available units: all of 1..units up to
// 16 units, else 1..8, `units` itself, and the powers of two and three times powers of two below.
std::vector<int> replicaCandidates(int units);

// Returns the best plan; throws PlanError (see infeasibleMessage) when none fits in memory.
Plan planDynamicProgramming(const PlanRequest& request);

// The message for "no feasible plan": the smallest per-device memory any plan could need, the
// largest indivisible block and its size, and which options to change.
std::string infeasibleMessage(const PlanRequest& request);

}  // namespace autostage::decomposer
