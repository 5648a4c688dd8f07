#pragma once
// Baseline planners for comparison (decomposer = data_parallel | uniform | param_balanced) and
// the planStages dispatcher. Each baseline fixes the stage cuts its own way, gives every stage
// the same replica count, and picks micro-batches, schedule and recompute by evaluating the
// candidates with the shared cost model (evaluatePlan).

#include <utility>
#include <vector>

#include "decomposer/plan.h"

namespace autostage::decomposer {

// Pure data parallelism: one stage holding every block on all devices.
Plan planDataParallel(const PlanRequest& request);
// Equal block count per stage (NxD / Megatron style), best stage count.
Plan planUniform(const PlanRequest& request);
// Cuts balancing parameter bytes per stage (DeepSpeed partition_method="parameters"), best
// stage count.
Plan planParamBalanced(const PlanRequest& request);

// The baselines' plans the DP seeds its search with (Note [First plan] in dp_stage_search.cpp):
// uniform, param_balanced and (without partition_num > 1) data_parallel, each the fastest of its
// candidates by the closed form, with searchSeconds set; a baseline with no plan that fits is left
// out. Unlike the planners above it makes no message for those: infeasibleMessage's search costs
// seconds on 16k devices, and the DP has one to give when nothing at all fits.
std::vector<Plan> seedBaselines(const PlanRequest& request);

// Block ranges [first, last] of `stages` stages with equal block counts (the first stages take
// one more when it does not divide).
std::vector<std::pair<int, int>> uniformCuts(int blocks, int stages);
// Block ranges of `stages` stages whose parameter bytes are as even as prefix cuts allow.
std::vector<std::pair<int, int>> paramBalancedCuts(const PlanRequest& request, int stages);

}  // namespace autostage::decomposer
