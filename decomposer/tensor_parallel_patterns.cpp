// Finding the shardable patterns in the IR; see Note [Tensor-parallel patterns] in the header.
#include "decomposer/tensor_parallel_patterns.h"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "decomposer/coarsen.h"
#include "decomposer/tensor_parallel_split.h"

namespace autostage::decomposer {

// torch.export's `aten::linear.default` and `aten::add.Tensor` are TorchScript's `aten::linear`
// and `aten::add`.
std::string baseKind(const std::string& kind) {
  if (kind.rfind("aten::", 0) != 0) return kind;
  const size_t dot = kind.find('.', 6);
  return dot == std::string::npos ? kind : kind.substr(0, dot);
}

namespace {

using core::Graph;
using core::NodeId;
using core::ValueId;

bool oneOf(const std::string& kind, std::initializer_list<const char*> kinds) {
  const std::string base = baseKind(kind);
  for (const char* k : kinds)
    if (base == k) return true;
  return false;
}

// A tensor, or a list of tensors (prim::ListConstruct feeding aten::cat).
bool tensorLike(const core::Type& type) {
  return type.isTensor() || (type.kind() == core::TypeKind::List && !type.elements().empty() &&
                             type.elements()[0].isTensor());
}

bool producesTensor(const Graph& g, NodeId n) {
  for (ValueId v : g.node(n).outputs)
    if (tensorLike(g.value(v).type)) return true;
  return false;
}

bool isBatch(const Graph& g, ValueId v) {
  const core::ValueClass cls = g.value(v).cls;
  return cls == core::ValueClass::Batch || cls == core::ValueClass::Loss;
}

bool isLinear(const Graph& g, NodeId n) {
  const core::Node& node = g.node(n);
  if (!oneOf(node.kind, {"aten::linear", "aten::matmul", "aten::mm", "aten::addmm"})) return false;
  return std::any_of(node.inputs.begin(), node.inputs.end(),
                     [&](ValueId v) { return g.value(v).cls == core::ValueClass::Param; });
}

// The linear node's activation: its first BATCH input (kNoValue-like -1 when none).
ValueId activationOf(const Graph& g, NodeId n) {
  for (ValueId v : g.node(n).inputs)
    if (isBatch(g, v)) return v;
  return -1;
}

std::vector<NodeId> tensorConsumers(const Graph& g, ValueId v) {
  std::vector<NodeId> result;
  for (NodeId c : g.consumers(v))
    if (producesTensor(g, c) && std::find(result.begin(), result.end(), c) == result.end())
      result.push_back(c);
  return result;
}

bool isPerHead(const std::string& kind) {
  return oneOf(
      kind, {"aten::view", "aten::reshape", "aten::_unsafe_view", "aten::permute",
             "aten::transpose", "aten::contiguous", "aten::clone", "aten::alias", "aten::matmul",
             "aten::bmm", "aten::baddbmm", "aten::softmax", "aten::_softmax", "aten::dropout",
             "aten::div", "aten::mul", "aten::add", "aten::masked_fill", "aten::where",
             "aten::scaled_dot_product_attention",
             // rotary embeddings (rotate_half) and grouped K/V heads (repeat_kv)
             "aten::slice", "aten::neg", "aten::cat", "prim::ListConstruct", "aten::unsqueeze",
             "aten::squeeze", "aten::expand", "aten::to", "aten::_to_copy", "aten::type_as",
             // Falcon's K and V taken off each group by index, broadcast to its Q heads
             "aten::index", "aten::broadcast_to",
             // Q, K and V taken off a dimension of their own (ModernBERT's unbind)
             "aten::unbind", "aten::select",
             // GPT-J's rotary embeddings rotate every two features
             "aten::stack", "aten::flatten",
             // an RMSNorm or LayerNorm of each head's features (Qwen3's q_norm and k_norm,
             // Persimmon's q_layernorm and k_layernorm)
             "aten::pow", "aten::mean", "aten::rsqrt", "aten::layer_norm",
             // the scores' soft cap (Gemma-2's tanh(s / cap) * cap), their floor (XGLM's
             // max(s, finfo.min)) and other element-wise functions of each head's values
             "aten::tanh", "aten::sigmoid", "aten::exp", "aten::sqrt", "aten::sub", "aten::maximum",
             "aten::minimum", "aten::max", "aten::min"});
}

// Operations that may read a per-position tensor from outside the attention pattern: a mask
// (added, filled, or the attention's own mask argument) or rotary embeddings' cos and sin.
bool isMask(const std::string& kind) {
  return oneOf(kind, {"aten::add", "aten::masked_fill", "aten::where", "aten::mul",
                      "aten::scaled_dot_product_attention", "aten::baddbmm"});
}

bool isElementwise(const std::string& kind) {
  return oneOf(kind,
               {"aten::add",       "aten::sub",     "aten::mul",    "aten::div",      "aten::neg",
                "aten::pow",       "aten::sqrt",    "aten::rsqrt",  "aten::exp",      "aten::erf",
                "aten::gelu",      "aten::relu",    "aten::square", "aten::silu",     "aten::tanh",
                "aten::sigmoid",   "aten::dropout", "aten::to",     "aten::_to_copy", "aten::clone",
                "aten::contiguous"});
}

// A view or reshape that keeps the last dimension (GPT-2's Conv1D flattens the rows around its
// addmm): the hidden features stay where the column split put them.
bool keepsLastDimension(const Graph& g, NodeId n) {
  if (!oneOf(g.node(n).kind, {"aten::view", "aten::reshape", "aten::_unsafe_view"})) return false;
  const core::Node& node = g.node(n);
  const core::Type &in = g.value(node.inputs.at(0)).type, &out = g.value(node.outputs.at(0)).type;
  return in.isTensor() && out.isTensor() && in.shapeKnown() && out.shapeKnown() &&
         !in.shape().empty() && !out.shape().empty() && in.shape().back() == out.shape().back();
}

bool anyGraphOutput(const Graph& g, NodeId n) {
  for (ValueId v : g.node(n).outputs)
    if (g.isGraphOutput(v)) return true;
  return false;
}

// Grows `region` from the nodes of `queue` (already in it) through the tensor consumers of their
// outputs: a linear node reading such a value is the pattern's one row-parallel end (`*end`);
// any other consumer must satisfy `inside` and is added. False when a consumer fails, or a
// second end appears.
template <typename Inside>
bool growRegion(const Graph& g, const std::vector<char>& used, Inside inside,
                std::set<NodeId>& region, std::vector<NodeId> queue, NodeId* end) {
  for (size_t i = 0; i < queue.size(); ++i)
    for (ValueId v : g.node(queue[i]).outputs)
      for (NodeId c : tensorConsumers(g, v)) {
        if (region.count(c)) continue;
        if (isLinear(g, c) && !used[c] && activationOf(g, c) == v) {
          if (*end != core::kNoNode && *end != c) return false;
          *end = c;
          continue;
        }
        if (!inside(c) || anyGraphOutput(g, c)) return false;
        region.insert(c);
        queue.push_back(c);
      }
  return true;
}

// The BATCH tensor inputs of the region's nodes (`starts` excepted) that come from outside it.
std::vector<std::pair<NodeId, ValueId>> outsideInputs(const Graph& g,
                                                      const std::set<NodeId>& region,
                                                      const std::vector<NodeId>& starts) {
  std::vector<std::pair<NodeId, ValueId>> result;
  for (NodeId n : region) {
    if (std::find(starts.begin(), starts.end(), n) != starts.end()) continue;
    for (ValueId in : g.node(n).inputs) {
      if (!isBatch(g, in) || !g.value(in).type.isTensor()) continue;
      const NodeId p = g.producer(in);
      if (p == core::kNoNode || !region.count(p)) result.emplace_back(n, in);
    }
  }
  return result;
}

ShardPattern finish(bool attention, const std::set<NodeId>& region, NodeId end) {
  ShardPattern pattern{attention, {region.begin(), region.end()}, end};
  pattern.nodes.push_back(end);
  std::sort(pattern.nodes.begin(), pattern.nodes.end());
  return pattern;
}

// Attention from the nodes `qkv` (the Q, K and V linear nodes reading one value, or a fused
// projection and its split); empty nodes when it does not match.
ShardPattern matchAttention(const Graph& g, const std::vector<NodeId>& qkv,
                            const std::vector<char>& used) {
  std::set<NodeId> region(qkv.begin(), qkv.end());
  NodeId end = core::kNoNode;
  const auto perHead = [&](NodeId c) { return isPerHead(g.node(c).kind); };
  if (!growRegion(g, used, perHead, region, qkv, &end) || end == core::kNoNode) return {};
  for (const auto& [n, in] : outsideInputs(g, region, qkv))
    if (!isMask(g.node(n).kind)) return {};
  return finish(true, region, end);
}

// The linear nodes of `linears` grouped by the one row-parallel linear their outputs reach through
// per-head operations (those reaching none, or more than one, left out).
std::map<NodeId, std::vector<NodeId>> byRowLinear(const Graph& g,
                                                  const std::vector<NodeId>& linears,
                                                  const std::vector<char>& used) {
  std::map<NodeId, std::vector<NodeId>> groups;
  const auto perHead = [&](NodeId c) { return isPerHead(g.node(c).kind); };
  for (NodeId c : linears) {
    std::set<NodeId> region{c};
    NodeId end = core::kNoNode;
    if (growRegion(g, used, perHead, region, {c}, &end) && end != core::kNoNode)
      groups[end].push_back(c);
  }
  return groups;
}

// Q, K and V where an MLP's first linear reads the same value (a parallel layer, as GPT-J's,
// Phi's and Falcon's): the groups of byRowLinear of three or more.
std::vector<std::vector<NodeId>> parallelAttention(const Graph& g,
                                                   const std::vector<NodeId>& linears,
                                                   const std::vector<char>& used) {
  std::vector<std::vector<NodeId>> result;
  for (auto& [end, group] : byRowLinear(g, linears, used))
    if (group.size() >= 3) result.push_back(std::move(group));
  return result;
}

// Cross-attention (an encoder-decoder's: Q from the decoder's state, K and V from the encoder's
// output, which every decoder layer reads): the groups of byRowLinear of the linear nodes not in
// a pattern yet, three or more reading more than one value.
std::vector<std::vector<NodeId>> crossAttention(const Graph& g, const std::vector<char>& used) {
  std::vector<NodeId> linears;
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodeCount()); ++n)
    if (!used[n] && isLinear(g, n) && activationOf(g, n) >= 0) linears.push_back(n);
  std::vector<std::vector<NodeId>> result;
  for (auto& [end, group] : byRowLinear(g, linears, used)) {
    std::set<ValueId> inputs;
    for (NodeId n : group) inputs.insert(activationOf(g, n));
    if (group.size() >= 3 && inputs.size() > 1) result.push_back(std::move(group));
  }
  return result;
}

// A split of a tensor into parts along its last dimension (Phi-3's gate_up_proj output chunked
// into the gate and up halves), or TorchScript's unpacking of the parts' list.
bool splitsLastDimension(const Graph& g, NodeId n) {
  const core::Node& node = g.node(n);
  if (node.kind == "prim::ListUnpack") return true;
  if (!oneOf(node.kind, {"aten::chunk", "aten::split", "aten::split_with_sizes",
                         "aten::unsafe_split", "aten::unsafe_chunk"}) ||
      node.inputs.size() < 3)
    return false;
  const core::Type& in = g.value(node.inputs[0]).type;
  const NodeId p = g.producer(node.inputs[2]);
  const core::Attribute* dim = p == core::kNoNode || g.node(p).kind != "prim::Constant"
                                   ? nullptr
                                   : g.node(p).findAttribute("value");
  if (!in.isTensor() || !in.shapeKnown() || dim == nullptr ||
      !std::holds_alternative<int64_t>(dim->value))
    return false;
  const int64_t d = std::get<int64_t>(dim->value), rank = static_cast<int64_t>(in.shape().size());
  return d == -1 || d == rank - 1;
}

// MLP from the column-parallel linear node `first`; empty nodes when it does not match. The
// region from its output through element-wise nodes (views keeping the last dimension, and a
// split into parts along it: a fused gated MLP, Note [Fused parts] in tensor_parallel_split.h)
// must reach exactly one row-parallel linear, every tensor consumer of its values inside; a
// BATCH tensor from outside may only be a sibling column-parallel linear of the same activation
// (a gated MLP: act(gate(x)) * up(x)), whose consumers must then lie inside too.
ShardPattern matchMlp(const Graph& g, NodeId first, const std::vector<char>& used) {
  std::set<NodeId> region{first};
  NodeId row = core::kNoNode;
  const auto elementwise = [&](NodeId c) {
    return ((isElementwise(g.node(c).kind) || keepsLastDimension(g, c)) &&
            g.node(c).outputs.size() == 1) ||
           splitsLastDimension(g, c);
  };
  if (!growRegion(g, used, elementwise, region, {first}, &row)) return {};
  NodeId sibling = core::kNoNode;
  for (const auto& [n, in] : outsideInputs(g, region, {first})) {
    const NodeId p = g.producer(in);
    if (p == core::kNoNode || (sibling != core::kNoNode && p != sibling) || !isLinear(g, p) ||
        used[p] || activationOf(g, p) != activationOf(g, first))
      return {};
    sibling = p;
  }
  if (sibling != core::kNoNode) {
    region.insert(sibling);
    if (!growRegion(g, used, elementwise, region, {sibling}, &row)) return {};
    if (!outsideInputs(g, region, {first, sibling}).empty()) return {};
  }
  if (row == core::kNoNode) return {};
  return finish(false, region, row);
}

// The vocabulary of a 2-D PARAM: its first dimension (an embedding table's rows), or with
// `eitherDimension` its larger one (a head's weight, maybe transposed), when at least
// kVocabularyRows; 0 otherwise.
int64_t vocabularyRows(const core::Value& value, bool eitherDimension) {
  if (value.cls != core::ValueClass::Param || !value.type.shapeKnown()) return 0;
  const std::vector<int64_t>& shape = value.type.shape();
  if (shape.size() != 2) return 0;
  const int64_t rows = eitherDimension ? std::max(shape[0], shape[1]) : shape[0];
  return rows >= kVocabularyRows ? rows : 0;
}

// The vocabulary of node n's first input that has one (vocabularyRows).
int64_t vocabularyOf(const Graph& g, NodeId n, bool eitherDimension) {
  for (ValueId v : g.node(n).inputs)
    if (const int64_t rows = vocabularyRows(g.value(v), eitherDimension)) return rows;
  return 0;
}

bool isLoss(const std::string& kind) {
  return oneOf(kind, {"aten::cross_entropy", "aten::cross_entropy_loss", "aten::nll_loss",
                      "aten::nll_loss_nd", "aten::nll_loss2d"});
}

// An LM head from linear node `head` to its loss; empty nodes when it does not match.
ShardPattern matchVocabularyHead(const Graph& g, NodeId head) {
  const int64_t vocabulary = vocabularyOf(g, head, /*eitherDimension=*/true);
  const core::Type& out = g.value(g.node(head).outputs.at(0)).type;
  if (vocabulary == 0 || !out.shapeKnown() || out.shape().empty() ||
      out.shape().back() != vocabulary)
    return {};
  ShardPattern pattern;
  pattern.vocabulary = ShardPattern::Vocabulary::Head;
  pattern.allreduced = activationOf(g, head);
  pattern.head = head;
  pattern.nodes = {head};
  ValueId v = g.node(head).outputs[0];
  while (true) {
    const std::vector<NodeId> consumers = tensorConsumers(g, v);
    if (consumers.size() != 1 || g.isGraphOutput(v)) return {};  // returned logits are whole
    const NodeId c = consumers[0];
    const core::Node& node = g.node(c);
    pattern.nodes.push_back(c);
    if (isLoss(node.kind)) return pattern;
    if (!oneOf(node.kind, {"aten::view", "aten::reshape", "aten::contiguous", "aten::slice",
                           "aten::transpose", "aten::permute", "aten::add", "aten::log_softmax",
                           "aten::_log_softmax", "aten::to", "aten::_to_copy", "aten::float"}) ||
        node.outputs.size() != 1)
      return {};
    for (ValueId in : node.inputs)  // the bias add reads a PARAM or CONST, nothing per row
      if (in != v && isBatch(g, in) && g.value(in).type.isTensor()) return {};
    v = node.outputs[0];
  }
}

// The vocabulary table LM head `head` reads (a graph input, maybe through a transpose); -1 if
// none.
ValueId headTable(const Graph& g, NodeId head) {
  for (ValueId v : g.node(head).inputs) {
    const NodeId producer = g.producer(v);
    const ValueId table =
        producer != core::kNoNode && transposes2d(g, producer) ? g.node(producer).inputs.at(0) : v;
    if (g.producer(table) == core::kNoNode && vocabularyRows(g.value(table), true) > 0)
      return table;
  }
  return -1;
}

// `n` adds a 1-D parameter of `v`'s last dimension to `v` (a linear's bias written apart, as
// TorchScript traces `x @ w.t() + b`).
bool addsBias(const Graph& g, NodeId n, ValueId v) {
  const core::Node& node = g.node(n);
  if (!oneOf(node.kind, {"aten::add"}) || node.inputs.size() < 2) return false;
  const ValueId other = node.inputs[0] == v ? node.inputs[1] : node.inputs[0];
  const core::Type &bias = g.value(other).type, &value = g.value(v).type;
  return g.value(other).cls == core::ValueClass::Param && bias.isTensor() && bias.shapeKnown() &&
         value.isTensor() && value.shapeKnown() && bias.shape().size() == 1 &&
         !value.shape().empty() && bias.shape()[0] == value.shape().back();
}

// A fused QKV projection: linear node n whose output reaches, through views, transposes,
// unsqueezes and the add of its bias, a split into three or more tensors (aten::split /
// split_with_sizes / chunk / unbind with a tensor per output, or a list unpacked by
// prim::ListUnpack; or three or more slices): along the features, Q, K and V side by side
// (GPT-2's and GPT-BigCode's c_attn, Phi-3's qkv_proj; ModernBERT's Wqkv viewed into
// (3, heads, features) and unbound), or after a view into heads, each head's Q, K and V side by
// side (GPT-NeoX's and Megatron's layout). Returns n, the views and the split (and its
// unpack), the nodes the attention region starts from; empty when it does not match. Which
// layouts split, and how the weight's rows are then cut, the split's plan decides
// (tensor_parallel_split.h).
std::vector<NodeId> fusedQkvStart(const Graph& g, NodeId n) {
  std::vector<NodeId> start{n};
  NodeId at = n;
  while (true) {
    const std::vector<NodeId> consumers = tensorConsumers(g, g.node(at).outputs.at(0));
    if (anyGraphOutput(g, at)) return {};
    if (consumers.size() >= 3 && std::all_of(consumers.begin(), consumers.end(), [&](NodeId c) {
          return oneOf(g.node(c).kind, {"aten::slice", "aten::index", "aten::select"}) &&
                 !anyGraphOutput(g, c);
        })) {  // Phi-3's `qkv[..., :q]`, `qkv[..., q:q + kv]`, `qkv[..., q + kv:]`; Falcon's
               // `qkv[:, :, :, :-2]`, `[:, :, :, [-2]]`, `[:, :, :, [-1]]` (viewed into groups);
               // Persimmon's `qkv[..., 0, :]`, `[..., 1, :]`, `[..., 2, :]` (viewed into heads)
      start.insert(start.end(), consumers.begin(), consumers.end());
      return start;
    }
    if (consumers.size() != 1) return {};
    const NodeId c = consumers[0];
    if (addsBias(g, c, g.node(at).outputs.at(0)) ||
        (oneOf(g.node(c).kind,
               {"aten::view", "aten::reshape", "aten::_unsafe_view", "aten::transpose",
                "aten::permute", "aten::contiguous", "aten::unsqueeze"}) &&
         g.node(c).outputs.size() == 1)) {
      start.push_back(at = c);
      continue;
    }
    if (!oneOf(g.node(c).kind, {"aten::split", "aten::split_with_sizes", "aten::chunk",
                                "aten::unsafe_split", "aten::unbind"}))
      return {};
    start.push_back(c);
    const std::vector<ValueId>& outputs = g.node(c).outputs;
    if (outputs.size() >= 3) return start;
    if (outputs.size() == 1) {  // TorchScript: one list, unpacked
      const std::vector<NodeId> unpack = g.consumers(outputs[0]);
      if (unpack.size() == 1 && g.node(unpack[0]).kind == "prim::ListUnpack" &&
          g.node(unpack[0]).outputs.size() >= 3) {
        start.push_back(unpack[0]);
        return start;
      }
    }
    return {};
  }
}

}  // namespace

bool isLinearNode(const Graph& graph, NodeId node) { return isLinear(graph, node); }
ValueId linearActivation(const Graph& graph, NodeId node) { return activationOf(graph, node); }

std::vector<ShardPattern> findShardPatterns(const Graph& g) {
  std::vector<ShardPattern> patterns;
  std::vector<char> used(g.nodeCount(), 0);
  auto take = [&](ShardPattern p) {
    for (NodeId n : p.nodes) used[n] = 1;
    patterns.push_back(std::move(p));
  };
  for (const core::Value& x : g.values()) {
    if (!isBatch(g, x.id) || !x.type.isTensor()) continue;
    std::vector<NodeId> qkv;
    for (NodeId c : tensorConsumers(g, x.id))
      if (isLinear(g, c) && !used[c] && activationOf(g, c) == x.id) qkv.push_back(c);
    if (qkv.size() < 3) continue;
    ShardPattern p = matchAttention(g, qkv, used);
    if (!p.nodes.empty()) {
      take(std::move(p));
      continue;
    }
    if (qkv.size() == 3) continue;
    for (const std::vector<NodeId>& group : parallelAttention(g, qkv, used)) {
      ShardPattern q = matchAttention(g, group, used);
      if (!q.nodes.empty()) take(std::move(q));
    }
  }
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodeCount()); ++n) {  // fused QKV projections
    if (used[n] || !isLinear(g, n)) continue;
    const std::vector<NodeId> start = fusedQkvStart(g, n);
    if (start.empty()) continue;
    ShardPattern p = matchAttention(g, start, used);
    if (!p.nodes.empty()) take(std::move(p));
  }
  for (const std::vector<NodeId>& group : crossAttention(g, used)) {
    ShardPattern p = matchAttention(g, group, used);
    if (!p.nodes.empty()) take(std::move(p));
  }
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodeCount()); ++n) {
    if (used[n] || !isLinear(g, n)) continue;
    ShardPattern p = matchVocabularyHead(g, n);
    if (p.nodes.empty()) p = matchMlp(g, n, used);
    if (!p.nodes.empty()) take(std::move(p));
  }
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodeCount()); ++n) {
    const core::Node& node = g.node(n);
    if (used[n] || !oneOf(node.kind, {"aten::embedding"}) || vocabularyOf(g, n, false) == 0)
      continue;
    ShardPattern p;
    p.vocabulary = ShardPattern::Vocabulary::Embedding;
    p.nodes = {n};
    p.allreduced = node.outputs.at(0);
    take(std::move(p));
  }
  // A table tied to both ends: its embedding joins the head's pattern.
  std::vector<ShardPattern> joined;
  std::vector<char> absorbed(patterns.size(), 0);
  for (ShardPattern& head : patterns) {
    if (head.vocabulary != ShardPattern::Vocabulary::Head) continue;
    const ValueId table = headTable(g, head.head);
    for (size_t e = 0; e < patterns.size(); ++e) {
      const ShardPattern& embedding = patterns[e];
      if (absorbed[e] || embedding.vocabulary != ShardPattern::Vocabulary::Embedding || table < 0 ||
          g.node(embedding.nodes.front()).inputs.at(0) != table)
        continue;
      absorbed[e] = 1;
      head.tiedEmbedding = embedding.nodes.front();
      head.nodes.insert(std::lower_bound(head.nodes.begin(), head.nodes.end(), head.tiedEmbedding),
                        head.tiedEmbedding);
      break;
    }
  }
  for (size_t i = 0; i < patterns.size(); ++i)
    if (!absorbed[i]) joined.push_back(std::move(patterns[i]));
  patterns = std::move(joined);
  std::sort(patterns.begin(), patterns.end(),
            [](const ShardPattern& a, const ShardPattern& b) { return a.nodes < b.nodes; });
  return patterns;
}

namespace {

void add(core::LinearCost& a, const core::LinearCost& b) {
  a.fixed += b.fixed;
  a.perSample += b.perSample;
}

}  // namespace

void addShardableSpans(const Graph& g, const core::GraphProfile& profile,
                       const std::vector<ShardPattern>& patterns,
                       const std::vector<BlockCost>& groupCost,
                       const std::vector<core::LinearCost>& groupWorking, Blocking& b) {
  std::vector<int> groupOf(g.nodeCount(), -1), blockOf(b.groups.size(), -1);
  std::map<ValueId, int> paramGroups;  // groups reading each parameter
  for (size_t i = 0; i < b.groups.size(); ++i) {
    groupOf[b.groups[i].main] = static_cast<int>(i);
    for (ValueId p : b.groups[i].params) ++paramGroups[p];
  }
  for (int blk = 0; blk < b.blockCount(); ++blk)
    for (int gi = b.blockFirstGroup[blk]; gi < b.blockFirstGroup[blk + 1]; ++gi) blockOf[gi] = blk;
  std::vector<ShardableSpan>& spans = b.request.shardable;
  spans.clear();
  // The degrees each pattern splits at, by the runtime's own check (tensor_parallel_split.h).
  const SplitDegrees split = splitDegrees(g, patterns);
  b.replicatedAt = split.replicated;
  b.wholeKvAt.clear();
  for (const std::map<int, std::set<NodeId>>& whole : split.wholeNodes)
    for (const auto& [t, nodes] : whole) ++b.wholeKvAt[t];
  b.patterns = patterns.size();
  // Adds the span of `nodes` (a pattern, or one end of a tied one) at `degrees`; `table`: the
  // bytes of a tied table it splits besides its own parameters (read by the other end too).
  // Returns it; with lastBlock -1, not added, when no node of it heads a group.
  auto addSpan = [&](const ShardPattern& pattern, const std::vector<NodeId>& nodes,
                     unsigned degrees, double table, const core::LinearCost& allreduced,
                     const std::set<ValueId>& whole, const std::map<int, std::set<NodeId>>& wholeAt,
                     const std::map<ValueId, double>& wholeShare) {
    ShardableSpan span{b.blockCount(), -1, {}, degrees};
    ShardableCost& s = span.cost;
    std::map<ValueId, int> inPattern;
    // Note [Tensor-parallel profile] (profiler/split_profile.h): a group's measured times on one
    // member where the profile has them (calibrated as groupCosts calibrates the whole ones, and
    // no more than those), else the whole ones / t.
    std::array<ShardableSpan::MemberTimes, 3> member;
    // Whether a node is measured at the degree, or runs whole there (Note [Whole K/V heads]):
    // then the member times differ from the whole ones / t.
    std::array<bool, 3> memberKnown{};
    for (NodeId n : nodes) {
      const int gi = groupOf[n];
      if (gi < 0) continue;  // not a group's main node: no cost of its own
      span.firstBlock = std::min(span.firstBlock, blockOf[gi]);
      span.lastBlock = std::max(span.lastBlock, blockOf[gi]);
      const BlockCost& whole = groupCost[gi];
      add(s.forwardSeconds, whole.forwardSeconds);
      add(s.backwardSeconds, whole.backwardSeconds);
      bool runsWhole = false;  // at some degree (Note [Whole K/V heads])
      for (int t : {2, 4, 8}) {
        const int k = ShardableSpan::slot(t);
        const core::SplitTimes* measured = profile.nodes[n].splitAt(t);
        memberKnown[k] = memberKnown[k] || measured;
        const auto at = wholeAt.find(t);
        const bool wholeAtT = at != wholeAt.end() && at->second.count(n) != 0;
        runsWhole = runsWhole || wholeAtT;
        memberKnown[k] = memberKnown[k] || wholeAtT;
        auto part = [&](const core::LinearCost& wholeCost, const core::LinearCost* split) {
          if (!split && wholeAtT) return wholeCost;
          if (!split) return core::LinearCost{wholeCost.fixed / t, wholeCost.perSample / t};
          return core::LinearCost{
              std::min(wholeCost.fixed, split->fixed * profile.calibration),
              std::min(wholeCost.perSample, split->perSample * profile.calibration)};
        };
        add(member[k].forwardSeconds,
            part(whole.forwardSeconds, measured ? &measured->forwardSeconds : nullptr));
        add(member[k].backwardSeconds,
            part(whole.backwardSeconds, measured ? &measured->backwardSeconds : nullptr));
      }
      // A column-parallel linear keeps its input for backward, and that input is whole on every
      // member (bench/memory_accuracy: dividing it by t put tp=2 plans 12-22% under the
      // measured peak); what the others keep is split (their inputs are the linears' slices).
      // A node run whole keeps its activations whole (counted so at every degree: at one where
      // K and V split, theirs count whole too, which errs high).
      if (!(isLinear(g, n) && n != pattern.rowLinear) && !runsWhole)
        add(s.activationBytes, groupCost[gi].activationBytes);
      for (ValueId p : b.groups[gi].params) {
        const core::Type& type = g.value(p).type;
        if (n == pattern.rowLinear && type.shapeKnown() && type.shape().size() == 1) continue;
        ++inPattern[p];
      }
    }
    if (span.lastBlock < 0) return span;
    for (int k = 0; k < 3; ++k)
      if (memberKnown[k]) span.measured[k] = member[k];
    for (const auto& [param, count] : inPattern) {
      const int64_t bytes = g.value(param).type.bytes();
      if (count != paramGroups[param] || bytes <= 0 || whole.count(param)) continue;
      const auto share = wholeShare.find(param);  // Note [Fused parts]: rows held whole
      s.paramBytes +=
          static_cast<double>(bytes) * (share == wholeShare.end() ? 1.0 : 1.0 - share->second);
    }
    s.paramBytes += table;
    s.allreducePairs = 1;
    s.allreduceBytes = allreduced;
    spans.push_back(span);
    return span;
  };
  for (size_t i = 0; i < patterns.size(); ++i) {
    const ShardPattern& pattern = patterns[i];
    if (pattern.vocabulary == ShardPattern::Vocabulary::None) {
      // A pair: the output's all-reduce forward, the input gradient's backward (as large). A
      // cross-attention's K and V read a second input: its gradient's all-reduce, half a pair.
      core::LinearCost bytes = valueBytes(g, profile, g.node(pattern.rowLinear).outputs.at(0));
      std::set<ValueId> inputs;
      for (NodeId n : pattern.nodes)
        if (n != pattern.rowLinear && isLinear(g, n)) inputs.insert(activationOf(g, n));
      if (inputs.size() > 1) {
        for (auto v = std::next(inputs.begin()); v != inputs.end(); ++v) {
          const core::LinearCost second = valueBytes(g, profile, *v);
          bytes.fixed += second.fixed / 2;
          bytes.perSample += second.perSample / 2;
        }
      }
      addSpan(pattern, pattern.nodes, split.degrees[i], 0, bytes, split.partial[i],
              split.wholeNodes[i], split.wholeShare[i]);
      continue;
    }
    // A vocabulary pattern's one all-reduce as a pair of half its bytes each way.
    auto half = [&](ValueId v) {
      const core::LinearCost bytes = valueBytes(g, profile, v);
      return core::LinearCost{bytes.fixed / 2, bytes.perSample / 2};
    };
    if (pattern.tiedEmbedding == core::kNoNode) {
      addSpan(pattern, pattern.nodes, split.degrees[i], 0, half(pattern.allreduced),
              split.partial[i], split.wholeNodes[i], split.wholeShare[i]);
      continue;
    }
    // Note [Tied tables across stages]: each end splits the table in the stage holding it; a
    // stage holding both counts it once (the third span, over both, takes one back).
    const NodeId embedding = pattern.tiedEmbedding;
    const ValueId table = g.node(embedding).inputs.at(0);
    const double tableBytes =
        static_cast<double>(std::max<int64_t>(0, g.value(table).type.bytes()));
    std::vector<NodeId> headNodes;
    for (NodeId n : pattern.nodes)
      if (n != embedding) headNodes.push_back(n);
    const ShardableSpan head =
        addSpan(pattern, headNodes, split.degrees[i], tableBytes, half(pattern.allreduced),
                split.partial[i], split.wholeNodes[i], split.wholeShare[i]);
    const ShardableSpan embedded = addSpan(pattern, {embedding}, split.degrees[i], tableBytes,
                                           half(g.node(embedding).outputs.at(0)), split.partial[i],
                                           split.wholeNodes[i], split.wholeShare[i]);
    if (head.lastBlock < 0 || embedded.lastBlock < 0 || tableBytes <= 0) continue;
    // The runtime splits the embedding's end alone only in a stage holding no other reader of
    // the table (planPatterns), and both ends when it holds the whole head as well: the
    // correction runs from the embedding to the first block reading the table after it, so a
    // stage holding the embedding and that block counts the table split once, or not at all.
    int reader = b.blockCount();
    for (size_t gi = 0; gi < b.groups.size(); ++gi) {
      if (blockOf[gi] < embedded.firstBlock || blockOf[gi] >= reader) continue;
      const AtomicGroup& group = b.groups[gi];
      auto reads = [&](NodeId n) {
        const std::vector<ValueId>& in = g.node(n).inputs;
        return n != embedding && std::find(in.begin(), in.end(), table) != in.end();
      };
      if (reads(group.main) || std::any_of(group.attached.begin(), group.attached.end(), reads))
        reader = blockOf[gi];
    }
    if (reader == b.blockCount()) continue;
    ShardableSpan both{embedded.firstBlock, reader, {}, split.degrees[i]};
    both.cost.paramBytes = -tableBytes;
    spans.push_back(both);
  }
  // Note [Tensor-parallel working memory]: what the groups outside every pattern need, per
  // block holding a pattern's group.
  std::vector<char> inPattern(b.groups.size(), 0);
  for (const ShardPattern& pattern : patterns)
    for (NodeId n : pattern.nodes)
      if (groupOf[n] >= 0) inPattern[groupOf[n]] = 1;
  for (int blk = 0; blk < b.blockCount(); ++blk) {
    BlockCost& block = b.request.blocks[blk];
    block.replicatedWorkingBytes.reset();
    core::LinearCost replicated;
    bool holdsPattern = false;
    for (int gi = b.blockFirstGroup[blk]; gi < b.blockFirstGroup[blk + 1]; ++gi) {
      if (inPattern[gi]) {
        holdsPattern = true;
        continue;
      }
      replicated.fixed = std::max(replicated.fixed, groupWorking[gi].fixed);
      replicated.perSample = std::max(replicated.perSample, groupWorking[gi].perSample);
    }
    if (holdsPattern) block.replicatedWorkingBytes = replicated;
  }
  std::stable_sort(spans.begin(), spans.end(), [](const ShardableSpan& x, const ShardableSpan& y) {
    return x.lastBlock < y.lastBlock;
  });
}

}  // namespace autostage::decomposer
