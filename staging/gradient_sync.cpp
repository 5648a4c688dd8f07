#include "staging/gradient_sync.h"

#include <algorithm>
#include <cmath>

#include <map>
#include <set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "staging/stage_runner.h"
#include "staging/tensor_parallel.h"

namespace autostage::staging {

at::Tensor GradientGroup::part(const at::Tensor& t, int rank) const {
  if (!piece()) return t;
  const auto at = std::lower_bound(ranks.begin(), ranks.end(), rank);
  AUTOSTAGE_INTERNAL_ASSERT(at != ranks.end() && *at == rank, "rank ", rank,
                            " is not a member of a gradient group");
  return t.narrow(0, rows.offsets[at - ranks.begin()], rows.count);
}

namespace {

// How one stage holds a parameter: `degree` 1 whole on every rank, else member i % degree of
// `ranks` holds slice i % degree of each part of `parts` (empty: one part) and the whole parts.
struct Holding {
  int degree = 1;
  const std::vector<int>* ranks = nullptr;
  std::vector<decomposer::ShardPart> parts;
};

// Note [Fused parts] in decomposer/tensor_parallel_split.h: the groups of a parameter one stage
// holds with whole parts, one per piece of rows: a cut part's slice j summed over the members j
// of every replica group, a whole part over every rank of the stage.
std::vector<GradientGroup> partGroups(core::ValueId param, const Holding& h) {
  std::vector<GradientGroup> groups;
  int64_t offset = 0;  // of the part in a member's tensor
  for (const decomposer::ShardPart& part : h.parts) {
    const int64_t rows = part.whole ? part.size : part.size / h.degree;
    for (int j = 0; j < (part.whole ? 1 : h.degree); ++j) {
      GradientGroup g;
      g.params.push_back(param);
      g.rows.count = rows;
      for (size_t i = 0; i < h.ranks->size(); ++i)
        if (part.whole || static_cast<int>(i) % h.degree == j) {
          g.ranks.push_back((*h.ranks)[i]);
          g.rows.offsets.push_back(offset);
        }
      groups.push_back(std::move(g));
    }
    offset += rows;
  }
  return groups;
}

bool anyWhole(const std::vector<decomposer::ShardPart>& parts) {
  return std::any_of(parts.begin(), parts.end(),
                     [](const decomposer::ShardPart& p) { return p.whole; });
}

// Note [Tied tables across stages]: the groups of a parameter its stages hold in different
// slices, one per piece of rows.
std::vector<GradientGroup> pieceGroups(const core::Graph& graph, core::ValueId param,
                                       const std::vector<Holding>& holdings) {
  int finest = 1;
  for (const Holding& h : holdings) finest = std::max(finest, h.degree);
  for (const Holding& h : holdings)  // powers of two: each slice is whole pieces
    AUTOSTAGE_INTERNAL_ASSERT(finest % h.degree == 0, "parameter ", graph.value(param).name,
                              " is sliced at degrees ", h.degree, " and ", finest);
  const core::Type& type = graph.value(param).type;
  AUTOSTAGE_INTERNAL_ASSERT(
      type.shapeKnown() && !type.shape().empty() && type.shape()[0] % finest == 0, "parameter ",
      graph.value(param).name, " is sliced by rows that do not divide by ", finest);
  const int64_t rows = type.shape()[0] / finest;
  std::map<int, int> degreeOf;  // rank -> how it holds the parameter
  for (const Holding& h : holdings)
    for (int rank : *h.ranks) {
      const auto [it, added] = degreeOf.emplace(rank, h.degree);
      AUTOSTAGE_INTERNAL_ASSERT(added, "rank ", rank, " holds parameter ", graph.value(param).name,
                                " in two stages (tensor-parallel degrees ", it->second, " and ",
                                h.degree, ")");
    }
  std::vector<GradientGroup> groups;
  for (int piece = 0; piece < finest; ++piece) {
    std::map<int, int64_t> offsets;  // rank -> first row of the piece in its tensor
    for (const Holding& h : holdings) {
      const int per = finest / h.degree;  // pieces per slice
      for (size_t i = 0; i < h.ranks->size(); ++i)
        if (static_cast<int>(i) % h.degree == piece / per)
          offsets[(*h.ranks)[i]] = (piece % per) * rows;
    }
    GradientGroup g;
    g.params = {param};
    g.rows.count = rows;
    for (const auto& [rank, offset] : offsets) {
      g.ranks.push_back(rank);
      g.rows.offsets.push_back(offset);
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

}  // namespace

std::vector<GradientGroup> gradientGroups(const core::Graph& graph,
                                          const core::Deployment& deployment) {
  std::map<core::ValueId, std::set<int>> holders;
  std::map<core::ValueId, bool> allZero;
  std::map<core::ValueId, std::vector<Holding>> holdings;
  for (const core::StageDeployment& stage : deployment.stages) {
    std::map<core::ValueId, ParamShard> sliced;
    if (stage.tensorParallel > 1)
      for (const ParamShard& s : shardedParameters(graph, stage.nodes, stage.tensorParallel))
        sliced.emplace(s.param, s);
    for (core::ValueId p : stageParams(graph, stage)) {
      allZero.emplace(p, true).first->second &= stage.zero;
      auto s = sliced.find(p);
      holdings[p].push_back(
          {s == sliced.end() ? 1 : stage.tensorParallel, &stage.ranks,
           s == sliced.end() ? std::vector<decomposer::ShardPart>{} : s->second.parts});
    }
  }
  // Note [Tensor-parallel gradients]: one holder set per place in a tensor-parallel group.
  std::map<std::pair<core::ValueId, int>, std::set<int>> sliceHolders;
  std::vector<GradientGroup> pieces;
  for (const auto& [p, list] : holdings) {
    const bool alike = std::all_of(list.begin(), list.end(), [&](const Holding& h) {
      return h.degree == list.front().degree;
    });
    if (!alike) {  // Note [Tied tables across stages]
      for (GradientGroup& g : pieceGroups(graph, p, list)) pieces.push_back(std::move(g));
      continue;
    }
    if (std::any_of(list.begin(), list.end(), [](const Holding& h) { return anyWhole(h.parts); })) {
      AUTOSTAGE_INTERNAL_ASSERT(list.size() == 1, "parameter ", graph.value(p).name,
                                " with whole parts is held by ", list.size(), " stages");
      for (GradientGroup& g : partGroups(p, list.front())) pieces.push_back(std::move(g));
      continue;
    }
    for (const Holding& h : list) {
      if (h.degree == 1) {  // alike: whole on every stage
        holders[p].insert(h.ranks->begin(), h.ranks->end());
        continue;
      }
      for (size_t i = 0; i < h.ranks->size(); ++i)
        sliceHolders[{p, static_cast<int>(i % h.degree)}].insert((*h.ranks)[i]);
    }
  }
  std::map<std::pair<std::vector<int>, bool>, std::vector<core::ValueId>> byRanks;
  auto add = [&](core::ValueId param, const std::set<int>& ranks) {
    bool sharded = ranks.size() >= 2 && allZero[param];
    auto& params = byRanks[{std::vector<int>(ranks.begin(), ranks.end()), sharded}];
    if (std::find(params.begin(), params.end(), param) == params.end()) params.push_back(param);
  };
  for (const auto& [param, ranks] : holders) add(param, ranks);
  for (const auto& [key, ranks] : sliceHolders) add(key.first, ranks);
  for (auto& [key, params] : byRanks) std::sort(params.begin(), params.end());
  std::vector<GradientGroup> groups;
  for (auto& [key, params] : byRanks) groups.push_back({key.first, params, key.second, {}});
  for (GradientGroup& g : pieces) groups.push_back(std::move(g));
  std::stable_sort(
      groups.begin(), groups.end(),
      [](const GradientGroup& a, const GradientGroup& b) { return a.ranks < b.ranks; });
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

std::vector<std::vector<size_t>> GradientSync::buckets(const std::vector<at::Tensor>& tensors) const {
  std::vector<std::vector<size_t>> result;
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    int64_t size = t.numel() * static_cast<int64_t>(t.element_size());
    bool fits = !result.empty() &&
                tensors[result.back().front()].scalar_type() == t.scalar_type() &&
                bytes + size <= bucketBytes_;
    if (!fits) {
      result.emplace_back();
      bytes = 0;
    }
    result.back().push_back(i);
    bytes += size;
  }
  return result;
}

int GradientSync::syncAll(comm::Backend& backend, const comm::Group& group,
                          const std::vector<at::Tensor>& tensors, comm::ReduceOp op) const {
  int calls = 0;
  for (const std::vector<size_t>& indices : buckets(tensors)) {
    std::vector<at::Tensor> bucket;
    for (size_t i : indices) bucket.push_back(tensors[i]);
    calls += syncBucket(backend, group, bucket, op);
  }
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
        grads.push_back(group.part(p.mutable_grad(), backend.rank()));
      } else if (at::isFloatingType(p.scalar_type())) {
        buffers.push_back(group.part(p, backend.rank()));  // Note [Buffers across replicas]
      }
    }
    calls += group.sharded ? scatterAll(backend, commGroup, grads)
                           : syncAll(backend, commGroup, grads, comm::ReduceOp::Sum);
    calls += syncAll(backend, commGroup, buffers, comm::ReduceOp::Average);
  }
  return calls;
}

double GradientSync::globalNorm(comm::Backend& backend, const ParamStorage& params) const {
  at::NoGradGuard noGrad;
  double squares = 0;
  for (const ShardPiece& piece : shards(backend.rank(), params)) {
    const at::Tensor& p = params.tensor(piece.param);
    if (p.grad().defined())
      squares += p.grad().reshape(-1).narrow(0, piece.offset, piece.length).to(at::kDouble)
                     .pow(2).sum().item<double>();
  }
  for (const GradientGroup& group : groups_) {
    if (group.sharded || group.ranks.empty() || group.ranks.front() != backend.rank()) continue;
    for (core::ValueId id : group.params) {
      const at::Tensor& p = params.tensor(id);
      if (p.requires_grad() && p.grad().defined())
        squares += group.part(p.grad(), backend.rank()).to(at::kDouble).pow(2).sum().item<double>();
    }
  }
  at::Tensor total =
      at::full({1}, squares, at::dtype(at::kDouble).device(backend.tensorDevice()));
  backend.allReduce(total, comm::ReduceOp::Sum, comm::Group::world(backend.worldSize()));
  return std::sqrt(total.item<double>());
}

std::vector<at::Tensor> GradientSync::trainable(const GradientGroup& group,
                                                const ParamStorage& params) {
  std::vector<at::Tensor> result;
  for (core::ValueId id : group.params)
    if (params.tensor(id).requires_grad()) result.push_back(params.tensor(id));
  return result;
}

bool GradientSync::anySharded() const {
  for (const GradientGroup& group : groups_)
    if (group.sharded) return true;
  return false;
}

namespace {
// This member's chunk of a bucket of `total` elements over `size` members (Note [ZeRO-1]):
// [begin, end) in bucket elements, and the chunk length every member pads to.
struct Chunk {
  int64_t begin = 0, end = 0, length = 0;
};
Chunk chunkOf(int64_t total, int size, int index) {
  Chunk c;
  c.length = (total + size - 1) / size;
  c.begin = std::min(total, index * c.length);
  c.end = std::min(total, c.begin + c.length);
  return c;
}

// Calls visit(tensor index, offset in tensor, offset in chunk, length) for every overlap of the
// bucket's tensors (consecutive in bucket order) with [chunk.begin, chunk.end).
template <typename Visit>
void forEachOwned(const std::vector<at::Tensor>& bucket, const Chunk& chunk, Visit visit) {
  int64_t start = 0;
  for (size_t i = 0; i < bucket.size(); ++i) {
    const int64_t end = start + bucket[i].numel();
    const int64_t lo = std::max(start, chunk.begin), hi = std::min(end, chunk.end);
    if (lo < hi) visit(i, lo - start, lo - chunk.begin, hi - lo);
    start = end;
  }
}

int64_t totalElements(const std::vector<at::Tensor>& bucket) {
  int64_t total = 0;
  for (const at::Tensor& t : bucket) total += t.numel();
  return total;
}
}  // namespace

int GradientSync::scatterAll(comm::Backend& backend, const comm::Group& group,
                             const std::vector<at::Tensor>& grads) const {
  const int index = group.indexOf(backend.rank());
  int calls = 0;
  for (const std::vector<size_t>& indices : buckets(grads)) {
    std::vector<at::Tensor> bucket, flat;
    for (size_t i : indices) bucket.push_back(grads[i]), flat.push_back(grads[i].reshape(-1));
    const Chunk chunk = chunkOf(totalElements(bucket), group.size(), index);
    const int64_t padding = chunk.length * group.size() - totalElements(bucket);
    if (padding > 0) flat.push_back(at::zeros({padding}, bucket.front().options()));
    at::Tensor whole = at::cat(flat);
    at::Tensor mine = at::empty({chunk.length}, whole.options());
    backend.reduceScatter(whole, mine, comm::ReduceOp::Sum, group);
    ++calls;
    for (const at::Tensor& g : bucket) g.zero_();  // the parts this member does not own
    forEachOwned(bucket, chunk, [&](size_t i, int64_t offset, int64_t position, int64_t length) {
      bucket[i].view(-1).narrow(0, offset, length).copy_(mine.narrow(0, position, length));
    });
  }
  return calls;
}

std::vector<ShardPiece> GradientSync::shards(int rank, const ParamStorage& params) const {
  std::vector<ShardPiece> pieces;
  for (const GradientGroup& group : groups_) {
    comm::Group commGroup(group.ranks);
    if (!group.sharded || !commGroup.contains(rank)) continue;
    std::vector<core::ValueId> ids;
    for (core::ValueId id : group.params)
      if (params.tensor(id).requires_grad()) ids.push_back(id);
    const std::vector<at::Tensor> tensors = trainable(group, params);
    for (const std::vector<size_t>& indices : buckets(tensors)) {
      std::vector<at::Tensor> bucket;
      for (size_t i : indices) bucket.push_back(tensors[i]);
      const Chunk chunk = chunkOf(totalElements(bucket), commGroup.size(), commGroup.indexOf(rank));
      std::vector<bool> owned(bucket.size(), false);
      forEachOwned(bucket, chunk, [&](size_t i, int64_t offset, int64_t, int64_t length) {
        pieces.push_back({ids[indices[i]], offset, length});
        owned[i] = true;
      });
      for (size_t i = 0; i < bucket.size(); ++i)
        if (!owned[i]) pieces.push_back({ids[indices[i]], 0, 0});
    }
  }
  return pieces;
}

template <typename Pick>
int GradientSync::gatherOwned(comm::Backend& backend, const ParamStorage& params,
                              Pick pick) const {
  at::NoGradGuard noGrad;
  int calls = 0;
  for (const GradientGroup& group : groups_) {
    comm::Group commGroup(group.ranks);
    if (!group.sharded || !commGroup.contains(backend.rank())) continue;
    std::vector<at::Tensor> tensors;
    for (const at::Tensor& p : trainable(group, params)) tensors.push_back(pick(p));
    for (const std::vector<size_t>& indices : buckets(tensors)) {
      std::vector<at::Tensor> bucket;
      for (size_t i : indices) bucket.push_back(tensors[i]);
      const int64_t total = totalElements(bucket);
      const Chunk chunk = chunkOf(total, commGroup.size(), commGroup.indexOf(backend.rank()));
      at::Tensor mine = at::zeros({chunk.length}, bucket.front().options());
      forEachOwned(bucket, chunk, [&](size_t i, int64_t offset, int64_t position, int64_t length) {
        mine.narrow(0, position, length).copy_(bucket[i].reshape(-1).narrow(0, offset, length));
      });
      at::Tensor whole = at::empty({chunk.length * commGroup.size()}, mine.options());
      backend.allGatherInto(mine, whole, commGroup);
      ++calls;
      int64_t start = 0;
      for (const at::Tensor& p : bucket) {
        p.view(-1).copy_(whole.narrow(0, start, p.numel()));
        start += p.numel();
      }
    }
  }
  return calls;
}

int GradientSync::gatherParams(comm::Backend& backend, const ParamStorage& params) const {
  return gatherOwned(backend, params, [](const at::Tensor& p) { return p; });
}

int GradientSync::gatherGrads(comm::Backend& backend, const ParamStorage& params) const {
  return gatherOwned(backend, params, [](const at::Tensor& p) {
    at::Tensor param = p;
    if (!param.grad().defined()) param.mutable_grad() = at::zeros_like(param);
    return param.grad();
  });
}

}  // namespace autostage::staging
