#pragma once
// Merging a request's blocks into fewer, coarser blocks (used to find a good first plan quickly:
// a plan of the coarse request is a plan of the original, with stage boundaries on a subset of
// the original boundaries).

#include <vector>

#include "decomposer/plan.h"

namespace autostage::decomposer {

struct MergedRequest {
  PlanRequest request;
  std::vector<int> firstBlock;  // original first block of each merged block, then n
};

// At most `blocks` blocks whose boundaries split the forward + backward time per sample evenly.
MergedRequest mergeRequestBlocks(const PlanRequest& request, int blocks);

// The original-block plan of a plan of the merged request.
Plan expandPlan(const MergedRequest& merged, const Plan& plan);

}  // namespace autostage::decomposer
