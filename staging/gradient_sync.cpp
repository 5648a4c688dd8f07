#include "staging/gradient_sync.h"

#include <map>
#include <set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "staging/stage_runner.h"

namespace autostage::staging {

std::vector<GradientGroup> gradientGroups(const core::Graph& graph,
                                          const core::Deployment& deployment) {
  std::map<core::ValueId, std::set<int>> holders;
  for (const core::StageDeployment& stage : deployment.stages)
    for (core::ValueId p : stageParams(graph, stage))
      holders[p].insert(stage.ranks.begin(), stage.ranks.end());
  std::map<std::vector<int>, std::vector<core::ValueId>> byRanks;
  for (const auto& [param, ranks] : holders)
    byRanks[std::vector<int>(ranks.begin(), ranks.end())].push_back(param);
  std::vector<GradientGroup> groups;
  for (auto& [ranks, params] : byRanks) groups.push_back({ranks, params});
  return groups;
}

GradientSync::GradientSync(std::vector<GradientGroup> groups, int64_t bucketBytes)
    : groups_(std::move(groups)), bucketBytes_(bucketBytes) {
  AUTOSTAGE_CHECK_AS(ConfigError, bucketBytes >= 1, "gradient bucket size must be >= 1 byte, got ",
                     bucketBytes);
}

int GradientSync::syncBucket(comm::Backend& backend, const comm::Group& group,
                             const std::vector<at::Tensor>& tensors) const {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : tensors) {
    const at::Tensor& g = p.grad();
    flat.push_back(g.defined() ? g.reshape(-1) : at::zeros({p.numel()}, p.options()));
  }
  at::Tensor bucket = at::cat(flat);
  backend.allReduce(bucket, comm::ReduceOp::Sum, group);
  int64_t offset = 0;
  for (const at::Tensor& p : tensors) {
    at::Tensor part = bucket.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
    if (p.grad().defined()) {
      p.mutable_grad().copy_(part);
    } else {
      p.mutable_grad() = part.clone();
    }
  }
  return 1;
}

int GradientSync::run(comm::Backend& backend, const ParamStorage& params) const {
  at::NoGradGuard noGrad;
  int calls = 0;
  for (const GradientGroup& group : groups_) {
    if (group.ranks.size() < 2) continue;
    comm::Group commGroup(group.ranks);
    if (!commGroup.contains(backend.rank())) continue;
    std::vector<at::Tensor> bucket;
    int64_t bytes = 0;
    for (core::ValueId id : group.params) {
      const at::Tensor& p = params.tensor(id);
      if (!p.requires_grad()) continue;
      int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
      bool fits = bucket.empty() || (bucket.front().scalar_type() == p.scalar_type() &&
                                     bytes + size <= bucketBytes_);
      if (!fits) {
        calls += syncBucket(backend, commGroup, bucket);
        bucket.clear();
        bytes = 0;
      }
      bucket.push_back(p);
      bytes += size;
    }
    if (!bucket.empty()) calls += syncBucket(backend, commGroup, bucket);
  }
  return calls;
}

}  // namespace autostage::staging
