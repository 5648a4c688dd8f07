#include "staging/gradient_sync.h"

#include <cmath>

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
                             const std::vector<at::Tensor>& tensors, comm::ReduceOp op) const {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : tensors) flat.push_back(t.reshape(-1));
  at::Tensor bucket = at::cat(flat);
  backend.allReduce(bucket, op, group);
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    t.copy_(bucket.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
  return 1;
}

int GradientSync::syncAll(comm::Backend& backend, const comm::Group& group,
                          const std::vector<at::Tensor>& tensors, comm::ReduceOp op) const {
  int calls = 0;
  std::vector<at::Tensor> bucket;
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    int64_t size = t.numel() * static_cast<int64_t>(t.element_size());
    bool fits = bucket.empty() || (bucket.front().scalar_type() == t.scalar_type() &&
                                   bytes + size <= bucketBytes_);
    if (!fits) {
      calls += syncBucket(backend, group, bucket, op);
      bucket.clear();
      bytes = 0;
    }
    bucket.push_back(t);
    bytes += size;
  }
  if (!bucket.empty()) calls += syncBucket(backend, group, bucket, op);
  return calls;
}

int GradientSync::run(comm::Backend& backend, const ParamStorage& params) const {
  at::NoGradGuard noGrad;
  int calls = 0;
  for (const GradientGroup& group : groups_) {
    if (group.ranks.size() < 2) continue;
    comm::Group commGroup(group.ranks);
    if (!commGroup.contains(backend.rank())) continue;
    std::vector<at::Tensor> grads, buffers;
    for (core::ValueId id : group.params) {
      const at::Tensor& p = params.tensor(id);
      if (p.requires_grad()) {
        if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
        grads.push_back(p.mutable_grad());
      } else if (at::isFloatingType(p.scalar_type())) {
        buffers.push_back(p);  // Note [Buffers across replicas]
      }
    }
    calls += syncAll(backend, commGroup, grads, comm::ReduceOp::Sum);
    calls += syncAll(backend, commGroup, buffers, comm::ReduceOp::Average);
  }
  return calls;
}

double GradientSync::globalNorm(comm::Backend& backend, const ParamStorage& params) const {
  at::NoGradGuard noGrad;
  double squares = 0;
  for (const GradientGroup& group : groups_) {
    if (group.ranks.empty() || group.ranks.front() != backend.rank()) continue;
    for (core::ValueId id : group.params) {
      const at::Tensor& p = params.tensor(id);
      if (p.requires_grad() && p.grad().defined())
        squares += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    }
  }
  at::Tensor total = at::full({1}, squares, at::TensorOptions().dtype(at::kDouble));
  backend.allReduce(total, comm::ReduceOp::Sum, comm::Group::world(backend.worldSize()));
  return std::sqrt(total.item<double>());
}

}  // namespace autostage::staging
