#pragma once
// Exact dynamic-programming stage search over the block sequence (decomposer = dp).
//
// Search space (Note [DP search space]): every split of the blocks into contiguous stages; per
// stage a replica count from replicaCandidates() (in device units, see deviceUnit()), a
// tensor-parallel degree from PlanOptions::tensorParallelCandidates() (the stage then spans
// replicas x degree ranks, its first rank a multiple of the degree: Note [Tensor-parallel cost]
// in cost_model.h) and a recompute flag; micro-batch counts from PlanOptions::microBatchCandidates(); schedules from
// PlanOptions::scheduleCandidates(); stages laid out on ascending contiguous rank ranges ending at
// the last rank. The objective is the closed form of Note [Pipeline cost model] (cost_model.h;
// PlanEvaluation::searchSeconds), under the memory limit. The search is exact over this space: it
// keeps, per (first block of the suffix, devices used, stages after), every partial plan not
// dominated in (sum of stage times, max stage time, max allreduce time).
//
// Note [Finalists]
// The closed form is exact for gpipe but up to ~18% off the simulated 1f1b schedule, so its
// optimum need not be the fastest plan. The search offers its incumbent every plan it completes:
// the baseline seeds, the merged levels' plans (Note [First plan]) and, for each micro-batch
// count, every complete plan left in the last cells (each beats the incumbent the count started
// with). These finalists cost nothing to collect (6 for the 96-layer BERT on 32 devices) and one
// simulation each (simulateTimeline over the cost model's stage times); planDynamicProgramming
// refines the ones that simulate fastest (ties: the closed-form optimum first) and returns the
// fastest plan found. The optimum is a finalist, so the plan returned never simulates slower than
// it.
// Choosing by the reported estimate instead was tried: it is a lower bound, and a finalist whose
// estimate is further below its schedule can win wrongly. On small instances it never did, but
// on the 10k-node BERT on 1024 devices (bench/plan_scaling) it chose a plan simulating 496.87 ms
// over the optimum's 489.22 ms. The simulator costs as little and cannot do that.
// Measured on small random instances against every plan of the space, simulated
// (dp_stage_search_test.cpp): the closed-form optimum alone simulates at worst 1.19x the best plan
// of the space, the fastest finalist at worst 1.17x (mean 1.005x). Keeping plans up to 2% (5%)
// above the incumbent brought the worst to 1.116x (1.097x) but prunes less (the 96-layer BERT
// then planned in 1.13x (1.6x) the time), so it is not done: planDynamicProgramming instead
// refines the fastest finalists by simulation (Note [Simulated refinement] in refine.h), which
// brings the worst to 1.019x and the mean to 1.00006x on 520 instances.

#include <vector>

#include "decomposer/plan.h"

namespace autostage::decomposer {

// Devices per replica unit: 1 up to 64 devices, else the smallest of 2 and 4 that brings the unit
// count to <= 64 (devices / unit, rounded down), else the smallest multiple of 8 that does
// (replica counts are multiples of it; Note [Tensor-parallel units]).
int deviceUnit(int devices);
// Replica counts (in units) the search tries for `units` available units: all of 1..units up to
// 16 units, else 1..8, `units` itself, and the powers of two and three times powers of two below.
std::vector<int> replicaCandidates(int units);

// Note [Tensor-parallel units]
// A stage of r replica units at tensor-parallel degree t spans r max(1, t / unit) units (of `unit`
// devices, deviceUnit) and holds its devices / t replicas of t ranks each: with one device per
// unit (up to 64 devices) r replicas on r t units; with units of 16 devices (1,024 devices) a
// degree of 8 still fits in one unit, as two replicas, so that a stage at degree 8 is as narrow
// as one at degree 1 (Megatron-LM's 1-trillion-parameter GPT on 3,072 devices, units of 64,
// plans 47 stages of one unit each at degree 8; with stages r t units wide it found none). A unit
// below 8 devices is a power of two, one of 8 or more a multiple of 8, so a unit and a degree
// (1, 2, 4 or 8) always divide one or the other and a stage's first rank is a multiple of its
// degree. Units of the smallest multiple of 8 rather than power of two: 3,072 devices make 64 units
// of 48 (units of 64 made 48), so Megatron-LM's own configuration of that GPT, 64 stages of 48
// devices (6 replicas at degree 8), is in the space (the 530B one's 35 stages of 72 devices are
// not: 2,520 devices make units of 40). Measured (2026-12-07, a100-80gb, fp16, recompute always,
// tied and fused GPTs of Table 1 planned as Megatron ran them, 1f1b): 530B 99.4 -> 77.9 s, 1T
// 158.8 -> 151.8 s; tensor_parallel=auto for the 1T 134.8 -> 125.4 s. Still coarse: a stage's
// devices are a multiple of the unit.
struct StageShape {
  int units = 1, replicas = 1;
};
StageShape stageShape(int replicaUnits, int tensorParallel, int unit);

// The schedules the DP searches for the options (Note [Schedule choice] in dp_stage_search.cpp:
// 1f1b only for a train_step plan with schedule=auto, as gpipe is never faster there).
std::vector<Schedule> searchedSchedules(const PlanOptions& options);

// The search's answer: the plan with the smallest closed form (exact over the search space), and
// the finalists (Note [Finalists]); every plan has decomposer, searchSeconds and predictedSeconds
// set. Throws PlanError (see infeasibleMessage) when none fits in memory.
struct DpSearchResult {
  Plan best;
  std::vector<Plan> finalists;
};
DpSearchResult searchDynamicProgramming(const PlanRequest& request);

// The fastest plan, simulated: the finalists (Note [Finalists]) and the interleaved plans (Note
// [Interleaved search]), refined (Note [Simulated refinement]); its phaseSeconds say what each
// step cost. Throws PlanError (see infeasibleMessage) when no plan fits in memory.
Plan planDynamicProgramming(const PlanRequest& request);

// The message for "no feasible plan": the smallest per-device memory any plan could need, the
// largest indivisible block and its size, and which options to change.
std::string infeasibleMessage(const PlanRequest& request);

}  // namespace autostage::decomposer
