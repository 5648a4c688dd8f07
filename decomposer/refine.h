#pragma once
// Local search around the DP's plan, ranked by the pipeline simulator (decomposer = dp).
//
// Note [Simulated refinement]
// The DP is exact over the closed form of Note [Pipeline cost model], which is exact for gpipe
// but not for 1f1b, nor for a plan whose stages differ in their forward/backward balance; its
// finalists (Note [Finalists]) recover part of that. refinePlan then climbs from a plan to the
// fastest simulated plan among its neighbours, repeatedly, until none is faster:
//   - a boundary between two adjacent stages moved by up to kSpan (4) blocks either way, and up
//     to kSpan adjacent boundaries moved by one block together;
//   - one device unit added to a stage from the free devices, returned to them, or moved from one
//     stage to another;
//   - each of these, and the plan itself, with every micro-batch count and schedule the options
//     allow, and every stage's recompute and ZeRO-1 setting the fastest that fits (a stage's
//     memory depends on its own setting only, and a faster stage never slows the schedule);
//   - two adjacent stages merged (their replicas summed, or one's kept and the other's freed or
//     given to another stage), or one stage split in two at up to 2 kSpan places (each half with
//     one unit, half, all, or all and the free devices of its replicas, as far as they go);
// with the stage count, micro-batch count and flags the options force kept. Stages stay on
// consecutive ranks ending at the last rank (the DP's layout). Every neighbour is checked by the
// evaluator (memory, shape) and timed by simulateTimeline over the cost model's stage times: the
// simulation, not an estimate, is what is compared, so a plan is only ever replaced by one that
// simulates faster. An interleaved plan (v > 1) climbs among the moves that keep its shape (the
// boundaries, the flags of all stages alike, the micro-batch count), timed by its evaluation
// (Note [Interleaved evaluation]). The climb stops when the neighbours it simulated add up to
// `maxWork` operations (stages x micro-batches x 2 each: what a simulation costs), so small
// requests are refined to a local optimum while a large one stays within a fraction of its search
// (the result, and the planner's phase times, say when it ran out).
// Measured on small random instances against every plan of the space (dp_stage_search_test.cpp):
// see the test's comment for the ratios before and after.

#include "decomposer/cost_model.h"
#include "decomposer/plan.h"

namespace autostage::decomposer {

// The simulated iteration time of a feasible plan (v = 1: simulateTimeline over the cost model's
// stage times; v > 1: its evaluation, itself a simulation). Infinity when the plan does not fit.
double simulatedSeconds(const CostModel& model, const Plan& plan);

struct Refinement {
  Plan plan;             // the best plan found (the start when nothing was faster)
  double seconds = 0;    // its simulated iteration time
  int evaluations = 0;   // neighbours evaluated
  double work = 0;       // their simulated operations
  int moves = 0;         // improvements taken
  bool exhausted = false;  // stopped by maxWork, not at a local optimum
};

// Simulated operations the planner lets refinePlan spend per plan (a few hundredths of a second).
constexpr double kRefineWork = 1.5e6;

// Climbs from `start` (a feasible plan of the request); see the Note.
Refinement refinePlan(const CostModel& model, const Plan& start, double maxWork);

}  // namespace autostage::decomposer
