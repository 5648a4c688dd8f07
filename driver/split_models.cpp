// Member models for the tensor-parallel profile; Note [Tensor-parallel profile] in
// profiler/split_profile.h.
#include "driver/split_models.h"

#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <utility>

#include "comm/thread_backend.h"
#include "comm/thread_world.h"
#include "core/error.h"
#include "decomposer/tensor_parallel_patterns.h"
#include "decomposer/tensor_parallel_split.h"
#include "staging/tensor_parallel.h"
#include "staging/tensor_parallel_ops.h"

namespace autostage::driver {
namespace {

// A group of one rank standing for `degree` members: member 0's collectives sum over itself
// alone, so the member's graph runs in this process and only its compute is timed.
struct SoloGroup {
  std::shared_ptr<comm::ThreadBackend> backend = std::make_shared<comm::ThreadBackend>(
      std::make_shared<comm::ThreadWorld>(1, comm::CommOptions()), 0);
  staging::TensorParallelGroup group{backend, comm::Group({0}), 0};
};

}  // namespace

std::vector<int> splitProfileDegrees(const core::Graph& graph,
                                     const decomposer::PlanOptions& options, int devicesPerNode,
                                     int worldSize) {
  std::vector<int> degrees;
  if (options.tensorParallel == "1") return degrees;
  const std::vector<decomposer::ShardPattern> patterns = decomposer::findShardPatterns(graph);
  if (patterns.empty()) return degrees;
  const decomposer::SplitDegrees split = decomposer::splitDegrees(graph, patterns);
  for (int t : options.tensorParallelCandidates(devicesPerNode)) {
    if (t <= 1 || t > worldSize) continue;
    for (unsigned bits : split.degrees)
      if ((bits >> t) & 1u) {
        degrees.push_back(t);
        break;
      }
  }
  return degrees;
}

std::optional<profiler::SplitModel> memberModel(const torchscript::ImportedModel& model,
                                                int degree) {
  const core::Graph& graph = model.graph;
  std::vector<core::NodeId> all(graph.nodeCount());
  std::iota(all.begin(), all.end(), 0);
  auto solo = std::make_shared<SoloGroup>();
  staging::ShardedStage stage = staging::shardStage(graph, all, degree, solo->group.handle());
  if (stage.patternNodes.empty()) return std::nullopt;
  const std::set<core::NodeId> inPattern(stage.patternNodes.begin(), stage.patternNodes.end());
  std::map<core::ValueId, size_t> paramIndex;
  const std::vector<core::ValueId> params = graph.paramInputs();
  for (size_t i = 0; i < params.size(); ++i) paramIndex[params[i]] = i;
  std::map<core::ValueId, decomposer::ParamShard> shards;
  for (const decomposer::ParamShard& s : stage.shards) shards[s.param] = s;

  profiler::SplitModel split;
  split.model.frontEnd = model.frontEnd;
  split.model.tupleOutput = model.tupleOutput;
  split.model.fixedBatchRows = model.fixedBatchRows;
  for (size_t i = 0; i < stage.inputs.size(); ++i) {
    const core::ValueId original = stage.inputs[i];
    if (stage.graph.value(stage.graph.inputs()[i]).cls != core::ValueClass::Param) continue;
    const size_t k = paramIndex.at(original);
    at::Tensor tensor = model.paramTensors.at(k);
    auto shard = shards.find(original);
    if (shard != shards.end())
      tensor = staging::shardTensor(tensor, shard->second, degree, 0)
                   .detach()
                   .requires_grad_(tensor.requires_grad());
    split.model.paramTensors.push_back(tensor);
    split.model.paramNames.push_back(model.paramNames.at(k));
  }
  for (core::NodeId n = 0; n < static_cast<core::NodeId>(stage.origin.size()); ++n)
    if (stage.origin[n] != core::kNoNode && inPattern.count(stage.origin[n]))
      split.measured.push_back(n);
  split.inputs = std::move(stage.inputs);
  split.origin = std::move(stage.origin);
  split.model.graph = std::move(stage.graph);
  split.model.graph.classifyValues();  // the profiler groups nodes by their values' classes
  split.context = std::move(solo);
  return split;
}

}  // namespace autostage::driver
