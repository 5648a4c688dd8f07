#pragma once
// Pipeline time of a plan from its per-stage operation times: the closed form for gpipe (exact)
// and a tight lower bound for 1f1b. It is the time the planners report for a plan (evaluatePlan's
// iterationSeconds, Plan::predictedSeconds; Note [Search objective and reported estimate] in
// cost_model.h); the DP still searches the closed form of Note [Pipeline cost model] (see "Why
// the DP does not use it" below).
//
// Note [1f1b pipeline estimate]
// A stage's forward op takes f = fwd + send of its output, its backward op b = bwd + send of its
// input gradient, t = f + b. Stage k of S runs w_k = min(S - k - 1, M - 1) warm-up forwards, then
// alternates, then drains (simulator.h; the same order as staging/executor.cpp). The makespan is
// the longest path through the (stage, micro-batch) operation graph; the event-driven simulator
// computes it exactly and is the reference.
//
// The old closed form sum t + (M - 1) max t is neither an upper nor a lower bound for uneven
// stages. Worked example: 2 stages, f = b = 3 ms on stage 0 and f = b = 1 ms on stage 1, M = 2.
// The closed form says 8 + 6 = 14 ms. The schedule: stage 0 runs F0 [0,3] F1 [3,6]; stage 1 runs
// F0 [3,4] B0 [4,5] F1 [6,7] B1 [7,8]; stage 0 runs B0 [6,9] B1 [9,12]: 12 ms, because stage 0's
// warm-up forward F1 hides stage 1's round trip. (With 12 uneven stages and M = 4 the closed form
// is instead ~10% below the schedule: the first M - 1 stages behave like gpipe.)
//
// The estimate is the longest of these path families, each an exact path length (so the estimate
// never exceeds the simulated makespan), with P_k = sum_{j<k} t_j (down with F0, up with B_{M-1})
// and R_k = sum_{j>k} t_j (a round trip below stage k):
//   P_k + M t_k                                 all of stage k's operations
//   P_k + R_k + M t_k - w_k min(f_k, b_k)       one round trip from the first or last micro-batch
//   P_k + n R_k + (M - (n - 1) w_k) t_k         n = floor((M - 1) / (w_k + 1)) + 1 >= 2 round
//                                                trips, spaced w_k + 1 micro-batches apart
//   P_k + L(k .. k + 3)                         the exact longest path of stages k to k + 3
//                                                alone (deeper stages take no time)
// Prepending stage k to a suffix with values (R, V) gives V' = max(X_k, t_k + V), X_k the largest
// of the families' stage-k terms; the iteration is V(all stages) + the longest allreduce. Each
// term is nondecreasing in R, V and the next three stages' f and b, so a suffix that is no worse
// in all of them (with the same stage count) is no worse in every completion: the dominance a DP
// over it needs. Measured against the simulator (tests/decomposer/estimate_check.h): on the
// planners' outputs of random instances in estimate_test.cpp the gap is at most 2.3% (a window
// of two stages left 8%); on its 400 random uneven plans, 3.1% (both tests hold 5%). Arbitrary
// stage times do worse: over 200,000 random vectors of 2-16 stages (1f1b, M = 1..32, a third
// of the stages 5x slower) the largest gap was 21.8%, at 13 stages and M = 8: paths
// zig-zagging over more than four stages are outside the window.
//
// Why the DP does not use it (yet): the recursion is decomposable and a DP over it is exact (an
// exhaustive-search check passed), but the warm-ups make the stage count part of the label
// (equal counts up to M + 2 instead of "fewer is better") and the window adds the first stages'
// times to the Pareto dimensions. Cells then held up to ~2,200 labels instead of a handful, and
// the 96-layer BERT on 32 devices took > 100 s instead of 1.6 s (without the window: 1.7 s for 64
// blocks, still > 100 s for 256). Until a cheaper dominance exists, the DP searches the closed
// form (up to 17.6% away from the 1f1b schedule on planner outputs), returns the plan among its
// finalists that simulates fastest (Note [Finalists] in dp_stage_search.h: on small instances
// at worst 1.17x the best simulated plan of the search space, against 1.19x for the closed-form
// optimum), and reports this estimate for it.

#include <array>
#include <vector>

#include "decomposer/plan.h"

namespace autostage::decomposer {

// One stage's per-micro-batch occupation: forward op and backward op, sends included.
struct StageTimes {
  double forward = 0;
  double backward = 0;
  double total() const { return forward + backward; }
};

// Stages whose exact joint longest path the 1f1b estimate includes.
constexpr int kOneFOneBWindow = 4;

// A 1f1b pipeline suffix summarised for prepending (see the Note).
struct OneFOneBSuffix {
  double sum = 0;      // R: summed stage times
  double longest = 0;  // V: the estimate of the suffix alone
  std::array<StageTimes, kOneFOneBWindow - 1> head{};  // the suffix's first stages (zero if none)
  // Stage count; callers may cap it at M + kOneFOneBWindow - 2 (where every warm-up in the
  // window saturates at M - 1).
  int stages = 0;
};

// Warm-up forwards of a 1f1b stage with `stagesAfter` stages after it (effective: M - 1 forwards
// followed by the first backward is the same order as M).
inline int oneFOneBWarmup(int stagesAfter, int microBatches) {
  return stagesAfter < microBatches - 1 ? stagesAfter : microBatches - 1;
}

// The suffix with `stage` prepended. Without the window term the result's `longest` may be
// smaller; max(it, oneFOneBWindowPath(...)) is then the full value.
OneFOneBSuffix prependOneFOneB(const OneFOneBSuffix& suffix, const StageTimes& stage, int microBatches,
                               bool includeWindow = true);
// The window term: the exact longest path of `stage` and the suffix's first stages alone.
double oneFOneBWindowPath(const OneFOneBSuffix& suffix, const StageTimes& stage, int microBatches);

// Exact longest path (first forward to last backward of the first stage) of `count` adjacent 1f1b
// stages alone, with their warm-ups; the last stage's backward of micro-batch i waits only for its
// own forward of i.
double chainOneFOneB(const StageTimes* stages, const int* warmups, int count, int microBatches);

// The planner's pipeline time (without allreduce) for stages in pipeline order.
double estimatePipelineSeconds(const std::vector<StageTimes>& stages, int microBatches, Schedule schedule);

}  // namespace autostage::decomposer
