#include "profiler/cost_model.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace autostage::profiler {
namespace {

bool isBatchLike(core::ValueClass cls) {
  return cls == core::ValueClass::Batch || cls == core::ValueClass::Loss;
}

}  // namespace

std::vector<NodeGroup> nodeGroups(const core::Graph& graph) {
  const auto count = static_cast<core::NodeId>(graph.nodeCount());
  std::vector<core::NodeId> owner(count, core::kNoNode);
  // Walk backwards: a PARAM/CONST node joins a group when every consumer is in that group
  // and none of its outputs leaves the graph.
  for (core::NodeId n = count - 1; n >= 0; --n) {
    if (isBatchLike(graph.nodeClass(n))) {
      owner[n] = n;
      continue;
    }
    bool returned = false;
    for (core::ValueId v : graph.node(n).outputs) returned = returned || graph.isGraphOutput(v);
    std::vector<core::NodeId> users = graph.successors(n);
    if (returned || users.empty()) continue;
    core::NodeId group = owner[users.front()];
    bool single = group != core::kNoNode;
    for (core::NodeId u : users) single = single && owner[u] == group;
    if (single) owner[n] = group;
  }
  std::vector<NodeGroup> groups;
  std::vector<int> index(count, -1);
  for (core::NodeId n = 0; n < count; ++n)
    if (owner[n] == n) {
      index[n] = static_cast<int>(groups.size());
      groups.push_back({n, {}});
    }
  for (core::NodeId n = 0; n < count; ++n)
    if (owner[n] != core::kNoNode) groups[index[owner[n]]].nodes.push_back(n);
  return groups;
}

std::vector<int64_t> paramBytesByNode(const core::Graph& graph) {
  std::vector<int64_t> bytes(graph.nodeCount(), 0);
  for (core::ValueId param : graph.paramInputs()) {
    // Breadth-first through PARAM/CONST nodes to the first BATCH/LOSS consumer (lowest id).
    core::NodeId first = core::kNoNode;
    std::vector<core::ValueId> frontier = {param};
    std::vector<bool> seen(graph.nodeCount(), false);
    while (!frontier.empty()) {
      core::ValueId v = frontier.back();
      frontier.pop_back();
      for (core::NodeId user : graph.consumers(v)) {
        if (seen[user]) continue;
        seen[user] = true;
        if (isBatchLike(graph.nodeClass(user))) {
          if (first == core::kNoNode || user < first) first = user;
        } else {
          for (core::ValueId out : graph.node(user).outputs) frontier.push_back(out);
        }
      }
    }
    int64_t size = graph.value(param).type.bytes();
    if (first != core::kNoNode && size > 0) bytes[first] += size;
  }
  return bytes;
}

int64_t exampleBatchSize(const core::Graph& graph) {
  for (core::ValueId v : graph.batchInputs()) {
    const core::Type& type = graph.value(v).type;
    if (type.isTensor() && type.shapeKnown() && !type.shape().empty() && type.shape()[0] > 0)
      return type.shape()[0];
  }
  return 1;
}

namespace {

// Bytes of `values` at `batch`: BATCH/LOSS values scale with the batch from the example's.
// With `onlyStageInputs`, graph inputs, PARAM/CONST values and non-floating tensors are skipped
// (they are data or parameters, not activations a stage receives and keeps).
int64_t valueBytes(const core::Graph& graph, const std::vector<core::ValueId>& values,
                   int64_t batch, bool onlyStageInputs) {
  double scale = static_cast<double>(batch) / static_cast<double>(exampleBatchSize(graph));
  double total = 0;
  for (core::ValueId v : values) {
    const core::Value& value = graph.value(v);
    int64_t bytes = value.type.bytes();
    if (bytes <= 0) continue;
    // Values derived from parameters alone (a weight's transpose) are recomputed from the
    // parameters a stage holds (charged as parameter bytes), never received from another stage.
    if (onlyStageInputs && (value.producer == core::kNoNode || !isBatchLike(value.cls) ||
                            !core::isFloatingPoint(value.type.dtype())))
      continue;
    total += isBatchLike(value.cls) ? bytes * scale : bytes;
  }
  return static_cast<int64_t>(total);
}

}  // namespace

BlockPrediction predictBlock(const core::Graph& graph, const core::GraphProfile& profile,
                             const std::vector<core::NodeId>& nodes, int64_t batch,
                             double optParamFactor) {
  AUTOSTAGE_CHECK_AS(PlanError, profile.nodes.size() == graph.nodeCount(), "profile has ",
                     profile.nodes.size(), " node entries but graph '", graph.name(), "' has ",
                     graph.nodeCount(), " nodes; re-profile this graph");
  BlockPrediction p;
  double forward = 0, backward = 0, activation = 0, working = 0;
  for (core::NodeId n : nodes) {
    AUTOSTAGE_CHECK_AS(PlanError, n >= 0 && size_t(n) < graph.nodeCount(), "node id ", n,
                       " is out of range: graph '", graph.name(), "' has ", graph.nodeCount(),
                       " nodes");
    const core::NodeProfile& np = profile.nodes[n];
    forward += np.forwardSeconds.at(batch);
    backward += np.backwardSeconds.at(batch);
    activation += std::max(0.0, np.activationBytes.at(batch));
    working = std::max(working, np.workingBytes.at(batch));
    p.paramBytes += np.paramBytes;
    if (!np.failure.empty() && (np.maxBatch < 0 || batch > np.maxBatch)) p.feasible = false;
  }
  p.forwardSeconds = forward * profile.calibration;
  p.backwardSeconds = backward * profile.calibration;
  p.activationBytes = static_cast<int64_t>(activation);
  p.workingBytes = static_cast<int64_t>(working);
  if (!nodes.empty()) {
    core::Boundary boundary = graph.boundary(nodes);
    p.inputBytes = valueBytes(graph, boundary.inputs, batch, true);
    p.outputBytes = valueBytes(graph, boundary.outputs, batch, false);
    p.outputGradBytes = valueBytes(graph, boundary.outputs, batch, true);
  }
  p.peakBytes = static_cast<int64_t>(p.paramBytes * (2 + optParamFactor)) + 2 * p.inputBytes +
                p.activationBytes + p.outputBytes + p.outputGradBytes + p.workingBytes;
  return p;
}

core::LinearCost fitLinear(const std::vector<double>& batches, const std::vector<double>& values) {
  AUTOSTAGE_INTERNAL_ASSERT(batches.size() == values.size() && !batches.empty());
  double n = static_cast<double>(batches.size());
  double mx = std::accumulate(batches.begin(), batches.end(), 0.0) / n;
  double my = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double sxy = 0, sxx = 0, sx2 = 0, sxv = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    sxy += (batches[i] - mx) * (values[i] - my);
    sxx += (batches[i] - mx) * (batches[i] - mx);
    sx2 += batches[i] * batches[i];
    sxv += batches[i] * values[i];
  }
  core::LinearCost cost;
  if (sxx <= 0) {  // one distinct batch size: assume proportional to the batch
    cost.perSample = mx > 0 ? my / mx : 0;
    return cost;
  }
  cost.perSample = sxy / sxx;
  cost.fixed = my - cost.perSample * mx;
  if (cost.perSample < 0) return {std::max(0.0, my), 0};
  if (cost.fixed < 0) return {0, sx2 > 0 ? std::max(0.0, sxv / sx2) : 0};
  return cost;
}

}  // namespace autostage::profiler
