// Block merging for the first plan; see request_merge.h.
#include "decomposer/request_merge.h"

#include <algorithm>
#include <map>

namespace autostage::decomposer {
namespace {

std::vector<int> evenBoundaries(const PlanRequest& request, int blocks) {
  const int n = static_cast<int>(request.blocks.size());
  std::vector<double> prefix(n + 1, 0);
  for (int b = 0; b < n; ++b)
    prefix[b + 1] = prefix[b] + request.blocks[b].forwardSeconds.perSample +
                    request.blocks[b].backwardSeconds.perSample + 1e-15;
  std::vector<int> firsts{0};
  for (int k = 1; k < blocks; ++k) {
    const double target = prefix[n] * k / blocks;
    int b = static_cast<int>(std::lower_bound(prefix.begin(), prefix.end(), target) - prefix.begin());
    b = std::min(std::max(b, firsts.back() + 1), n);
    if (b < n) firsts.push_back(b);
  }
  firsts.push_back(n);
  firsts.erase(std::unique(firsts.begin(), firsts.end()), firsts.end());
  return firsts;
}

}  // namespace

MergedRequest mergeRequestBlocks(const PlanRequest& request, int blocks) {
  MergedRequest m;
  m.firstBlock = evenBoundaries(request, blocks);
  m.request = request;
  m.request.blocks.clear();
  m.request.sharedParams.clear();
  std::vector<int> mergedOf(request.blocks.size());
  for (size_t k = 0; k + 1 < m.firstBlock.size(); ++k) {
    BlockCost c;
    for (int b = m.firstBlock[k]; b < m.firstBlock[k + 1]; ++b) {
      const BlockCost& o = request.blocks[b];
      mergedOf[b] = static_cast<int>(k);
      if (c.name.empty()) c.name = o.name;
      c.forwardSeconds = {c.forwardSeconds.fixed + o.forwardSeconds.fixed, c.forwardSeconds.perSample + o.forwardSeconds.perSample};
      c.backwardSeconds = {c.backwardSeconds.fixed + o.backwardSeconds.fixed, c.backwardSeconds.perSample + o.backwardSeconds.perSample};
      c.activationBytes = {c.activationBytes.fixed + o.activationBytes.fixed, c.activationBytes.perSample + o.activationBytes.perSample};
      if (o.replicatedWorkingBytes || c.replicatedWorkingBytes) {
        // Of the merged blocks, the groups outside every pattern: all of a block's without one.
        const core::LinearCost before = c.replicatedWorkingBytes.value_or(c.workingBytes);
        const core::LinearCost own = o.replicatedWorkingBytes.value_or(o.workingBytes);
        c.replicatedWorkingBytes = core::LinearCost{std::max(before.fixed, own.fixed),
                                                    std::max(before.perSample, own.perSample)};
      }
      c.workingBytes = {std::max(c.workingBytes.fixed, o.workingBytes.fixed), std::max(c.workingBytes.perSample, o.workingBytes.perSample)};
      c.cutBytesAfter = o.cutBytesAfter;
      c.paramBytes += o.paramBytes;
    }
    m.request.blocks.push_back(c);
  }
  for (const SharedParam& p : request.sharedParams) {
    SharedParam q{p.bytes, {}};
    for (int b : p.blocks)
      if (q.blocks.empty() || q.blocks.back() != mergedOf[b]) q.blocks.push_back(mergedOf[b]);
    if (q.blocks.size() == 1) m.request.blocks[q.blocks[0]].paramBytes += q.bytes;
    else m.request.sharedParams.push_back(q);
  }
  for (ShardableSpan& s : m.request.shardable)  // blocks map monotonically: order kept
    s.firstBlock = mergedOf[s.firstBlock], s.lastBlock = mergedOf[s.lastBlock];
  return m;
}

Plan expandPlan(const MergedRequest& merged, const Plan& plan) {
  Plan full = plan;
  for (StagePlan& s : full.stages) {
    s.firstBlock = merged.firstBlock[s.firstBlock];
    s.lastBlock = merged.firstBlock[s.lastBlock + 1] - 1;
  }
  return full;
}

}  // namespace autostage::decomposer
