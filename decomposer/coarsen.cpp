// Group costs, cuts and the greedy merge; see coarsen.h and Note [Merge order].
#include "decomposer/coarsen.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>

#include "core/error.h"
#include "decomposer/tensor_parallel_patterns.h"

namespace autostage::decomposer {
namespace {

core::LinearCost& operator+=(core::LinearCost& a, const core::LinearCost& b) {
  a.fixed += b.fixed;
  a.perSample += b.perSample;
  return a;
}

struct GroupCosts {
  std::vector<BlockCost> costs;  // one per group; cutBytesAfter = cut after the group
  std::vector<char> pinned;  // pinned[i]: a value the runtime cannot split crosses the cut after group i
};

// The traced batch size: dim 0 of the first BATCH graph input with a known shape; -1 if none.
int64_t tracedBatch(const core::Graph& graph) {
  for (core::ValueId v : graph.inputs()) {
    const core::Value& value = graph.value(v);
    if (value.cls == core::ValueClass::Batch && value.type.isTensor() && value.type.shapeKnown() &&
        !value.type.shape().empty())
      return value.type.shape()[0];
  }
  return -1;
}

// Whether the runtime can split `v` by samples: a tensor of known shape whose dim 0 is the traced
// batch (or dynamic), not known to be something else. Note [Non-tensor values are not cut].
bool splittable(const core::Value& v, int64_t batch) {
  if (!v.type.isTensor() || !v.type.shapeKnown()) return false;  // staging/route_check.cpp
  if (v.type.notBatchMajor()) return false;  // Note [Rows of a value] (core/ir/type.h)
  if (batch < 0) return true;
  if (!v.type.shape().empty() && v.type.shape()[0] < 0) return true;  // dynamic dim 0
  return !v.type.shape().empty() && v.type.shape()[0] == batch;
}

GroupCosts groupCosts(const core::Graph& graph, const core::GraphProfile& profile,
                      const std::vector<AtomicGroup>& groups) {
  GroupCosts result;
  for (const AtomicGroup& g : groups) {
    BlockCost c;
    const core::Node& main = graph.node(g.main);
    c.name = main.scope.empty() ? main.kind : main.scope;
    // PARAM/CONST nodes carry no batch-dependent cost (core/profile.h): the main node's profile
    // is the group's.
    // Node times are measured alone; the profile's calibration (measured/predicted on real
    // multi-node blocks) corrects their sum, so it scales every time here.
    const core::NodeProfile& p = profile.nodes[g.main];
    c.forwardSeconds = {p.forwardSeconds.fixed * profile.calibration,
                        p.forwardSeconds.perSample * profile.calibration};
    c.backwardSeconds = {p.backwardSeconds.fixed * profile.calibration,
                         p.backwardSeconds.perSample * profile.calibration};
    c.activationBytes = p.activationBytes;
    c.workingBytes = p.workingBytes;
    result.costs.push_back(c);
  }
  // Cuts: a BATCH value produced in group p and last read in group q > p crosses cuts p..q-1.
  std::vector<int> groupOf(graph.nodeCount(), -1);
  for (size_t i = 0; i < groups.size(); ++i) groupOf[groups[i].main] = static_cast<int>(i);
  std::vector<core::LinearCost> delta(groups.size() + 1);
  std::vector<int> pinnedDelta(groups.size() + 1, 0);
  const int64_t batch = tracedBatch(graph);
  for (const core::Value& v : graph.values()) {
    if (v.producer == core::kNoNode || groupOf[v.producer] < 0) continue;
    int p = groupOf[v.producer], q = p;
    for (const core::Use& u : v.uses) q = std::max(q, groupOf[u.node]);
    if (q == p) continue;
    if (!splittable(v, batch)) {  // Note [Non-tensor values are not cut]
      ++pinnedDelta[p];
      --pinnedDelta[q];
    }
    core::LinearCost bytes = valueBytes(graph, profile, v.id);
    delta[p] += bytes;
    delta[q] += core::LinearCost{-bytes.fixed, -bytes.perSample};
  }
  core::LinearCost running;
  int pinned = 0;
  result.pinned.assign(groups.size(), 0);
  for (size_t i = 0; i < groups.size(); ++i) {
    running += delta[i];
    pinned += pinnedDelta[i];
    result.costs[i].cutBytesAfter = running;
    result.pinned[i] = pinned > 0;
  }
  return result;
}

// Doubly linked blocks merged through a lazy priority queue of boundary scores. Pinned boundaries
// are merged first, whatever the block count.
std::vector<int> mergeGroups(const std::vector<BlockCost>& groups, const std::vector<char>& pinned,
                             int maxBlocks, double batch) {
  const int n = static_cast<int>(groups.size());
  std::vector<double> weight(n), cut(n);
  double smallestCut = INFINITY;
  for (int i = 0; i < n; ++i) {
    weight[i] = groups[i].forwardSeconds.at(batch) + groups[i].backwardSeconds.at(batch) + 1e-12;
    cut[i] = groups[i].cutBytesAfter.at(batch) + 1.0;
    if (i + 1 < n) smallestCut = std::min(smallestCut, cut[i]);
  }
  std::vector<int> next(n), prev(n), version(n, 0);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i - 1;
  // Block i is identified by its first group; its last group is next[i] - 1.
  auto score = [&](int i) {
    double ratio = smallestCut / cut[next[i] - 1];
    return (weight[i] + weight[next[i]]) * ratio * ratio * ratio * ratio;
  };
  int blocks = n;
  for (int i = 0; i + 1 < n;) {  // blocks joined over pinned boundaries; i is a block's first group
    int j = next[i];
    if (j < n && pinned[j - 1]) {
      weight[i] += weight[j];
      alive[j] = 0;
      next[i] = next[j];
      if (next[j] < n) prev[next[j]] = i;
      --blocks;
    } else {
      i = j;
    }
  }
  using Entry = std::tuple<double, int, int>;  // score, block, version
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
  for (int i = 0; i + 1 < n; i = next[i])
    if (next[i] < n) queue.push({score(i), i, 0});
  while (blocks > maxBlocks && !queue.empty()) {
    auto [s, i, v] = queue.top();
    queue.pop();
    if (!alive[i] || v != version[i] || next[i] >= n) continue;
    int j = next[i];
    weight[i] += weight[j];
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] < n) prev[next[j]] = i;
    --blocks;
    if (next[i] < n) queue.push({score(i), i, ++version[i]});
    if (prev[i] >= 0) queue.push({score(prev[i]), prev[i], ++version[prev[i]]});
  }
  std::vector<int> firsts;
  for (int i = 0; i < n; i = next[i]) firsts.push_back(i);
  firsts.push_back(n);
  return firsts;
}

// Bytes of a parameter input from its type; 0 when the type does not say.
double paramBytes(const core::Graph& graph, core::ValueId v) {
  int64_t bytes = graph.value(v).type.bytes();
  return bytes > 0 ? static_cast<double>(bytes) : 0.0;
}

// Note [Gradient accumulation temporaries]
// The profiler runs a node's backward with its parameters' gradients unset, so autograd stores
// them as the .grad tensors themselves (counted as gradients, not working memory). In training,
// .grad already exists (from an earlier micro-batch, or zeroed by optimizer.zero_grad()), so
// autograd computes each parameter gradient into a temporary and adds it: a node group's backward
// briefly holds the bytes of its parameters once more. A block's working memory is therefore the
// largest of its groups' measured working bytes plus that group's parameter bytes (measured by
// bench/memory_accuracy: without it every stage of the tutorial missed one 1 MiB weight).
// Returns each group's working bytes so counted.
std::vector<core::LinearCost> fillBlocks(const core::Graph& graph,
                                         const core::GraphProfile& profile, Blocking& b,
                                         const std::vector<BlockCost>& groupCost) {
  std::vector<core::LinearCost> groupWorking(b.groups.size());
  std::map<core::ValueId, std::vector<int>> users;  // param input -> blocks using it
  bool typedParams = false;
  for (int blk = 0; blk < b.blockCount(); ++blk) {
    BlockCost c;
    const int first = b.blockFirstGroup[blk], end = b.blockFirstGroup[blk + 1];
    c.name = groupCost[first].name;
    for (int g = first; g < end; ++g) {
      const BlockCost& gc = groupCost[g];
      c.forwardSeconds += gc.forwardSeconds;
      c.backwardSeconds += gc.backwardSeconds;
      c.activationBytes += gc.activationBytes;
      double gradientTemporaries = 0;  // Note [Gradient accumulation temporaries]
      for (core::ValueId p : b.groups[g].params) {
        auto& list = users[p];
        if (list.empty() || list.back() != blk) list.push_back(blk);
        typedParams = typedParams || paramBytes(graph, p) > 0;
        gradientTemporaries += paramBytes(graph, p);
      }
      if (gradientTemporaries == 0)
        gradientTemporaries = static_cast<double>(profile.nodes[b.groups[g].main].paramBytes);
      groupWorking[g] = {gc.workingBytes.fixed + gradientTemporaries, gc.workingBytes.perSample};
      c.workingBytes.fixed = std::max(c.workingBytes.fixed, groupWorking[g].fixed);
      c.workingBytes.perSample = std::max(c.workingBytes.perSample, groupWorking[g].perSample);
    }
    c.cutBytesAfter = groupCost[end - 1].cutBytesAfter;
    for (char& ch : c.name)
      if (ch == ' ' || ch == '\t' || ch == '\n') ch = '_';
    b.request.blocks.push_back(c);
  }
  if (!typedParams) {  // fall back to the profile's per-group parameter bytes
    for (int blk = 0; blk < b.blockCount(); ++blk)
      for (int g = b.blockFirstGroup[blk]; g < b.blockFirstGroup[blk + 1]; ++g)
        b.request.blocks[blk].paramBytes += static_cast<double>(profile.nodes[b.groups[g].main].paramBytes);
    return groupWorking;
  }
  for (const auto& [param, blocks] : users) {
    double bytes = paramBytes(graph, param);
    if (blocks.size() == 1) b.request.blocks[blocks[0]].paramBytes += bytes;
    else if (bytes > 0) b.request.sharedParams.push_back({bytes, blocks});
  }
  return groupWorking;
}

}  // namespace

core::LinearCost valueBytes(const core::Graph& graph, const core::GraphProfile& profile, core::ValueId id) {
  const core::Value& v = graph.value(id);
  const core::Type& t = v.type;
  int64_t bytes = t.bytes();
  if (bytes >= 0 && t.isTensor()) {
    if (t.shape().empty() || t.shape()[0] <= 0) return {static_cast<double>(bytes), 0};
    return {0, static_cast<double>(bytes) / static_cast<double>(t.shape()[0])};
  }
  if (!t.isTensor() || v.producer == core::kNoNode) return {8, 0};  // small messages
  const core::Node& producer = graph.node(v.producer);
  const core::LinearCost& out = profile.nodes[v.producer].outputBytes;
  double share = 1.0 / static_cast<double>(producer.outputs.size());
  return {out.fixed * share, out.perSample * share};
}

std::vector<core::NodeId> Blocking::stageNodes(int firstBlock, int lastBlock) const {
  std::vector<core::NodeId> nodes;
  for (int g = blockFirstGroup[firstBlock]; g < blockFirstGroup[lastBlock + 1]; ++g) {
    nodes.push_back(groups[g].main);
    nodes.insert(nodes.end(), groups[g].attached.begin(), groups[g].attached.end());
  }
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  return nodes;
}

Blocking buildBlocking(const core::Graph& graph, const core::GraphProfile& profile, int maxBlocks,
                       double referenceBatch, bool tensorParallel) {
  AUTOSTAGE_CHECK_AS(PlanError, profile.nodes.size() == graph.nodeCount(), "profile has ",
                     profile.nodes.size(), " node entries but graph '", graph.name(), "' has ",
                     graph.nodeCount(), " nodes; profile the same graph (hash ", graph.hash(), ")");
  Blocking b;
  b.groups = atomicGroups(graph);
  GroupCosts costs = groupCosts(graph, profile, b.groups);
  b.blockFirstGroup = mergeGroups(costs.costs, costs.pinned, std::max(1, maxBlocks), referenceBatch);
  const std::vector<core::LinearCost> groupWorking = fillBlocks(graph, profile, b, costs.costs);
  // Note [Tensor-parallel patterns]: found after the blocks are made, so the blocks stay those
  // of tensor_parallel=1 and the search space only grows.
  if (tensorParallel)
    addShardableSpans(graph, profile, findShardPatterns(graph), costs.costs, groupWorking, b);
  return b;
}

}  // namespace autostage::decomposer
