// Whether and how a pattern splits over a tensor-parallel group; see tensor_parallel_split.h.
#include "decomposer/tensor_parallel_split.h"

#include <algorithm>
#include <cstring>
#include <ostream>
#include <string_view>

#include "core/error.h"

namespace autostage::decomposer {

using core::Graph;
using core::NodeId;
using core::ValueId;

bool isKind(const core::Node& n, std::initializer_list<const char*> kinds) {
  // baseKind without the copy: this runs for every node of every pattern at every degree.
  std::string_view base = n.kind;
  if (base.rfind("aten::", 0) == 0) base = base.substr(0, base.find('.', 6));
  for (const char* k : kinds)
    if (base == k) return true;
  return false;
}

std::optional<int64_t> constantInt(const Graph& g, ValueId v) {
  const NodeId p = g.producer(v);
  if (p == core::kNoNode || g.node(p).kind != "prim::Constant") return std::nullopt;
  const core::Attribute* a = g.node(p).findAttribute("value");
  if (a == nullptr || !std::holds_alternative<int64_t>(a->value)) return std::nullopt;
  return std::get<int64_t>(a->value);
}

// A None argument (TorchScript's NoneType constant; torch.export's constant without a value).
bool isNone(const Graph& g, ValueId v) {
  if (g.value(v).type.kind() == core::TypeKind::None) return true;
  const NodeId p = g.producer(v);
  return p != core::kNoNode && g.node(p).kind == "prim::Constant" && !g.value(v).type.isTensor() &&
         g.node(p).findAttribute("value") == nullptr;
}

std::ostream& operator<<(std::ostream& out, const ShardPart& part) {
  return out << part.size << (part.whole ? " whole" : "");
}

std::vector<ShardPart> partsOf(const ParamShard& shard, int64_t extent) {
  if (!shard.parts.empty()) return shard.parts;
  return {ShardPart{extent, false}};
}

int64_t memberExtent(const std::vector<ShardPart>& parts, int degree) {
  int64_t extent = 0;
  for (const ShardPart& part : parts) extent += part.whole ? part.size : part.size / degree;
  return extent;
}

namespace {

// The entries of an int-list argument: constants, or nullopt where computed at run time.
std::optional<std::vector<std::optional<int64_t>>> listEntries(const Graph& g, ValueId v) {
  const NodeId p = g.producer(v);
  if (p == core::kNoNode) return std::nullopt;
  const core::Node& node = g.node(p);
  std::vector<std::optional<int64_t>> out;
  if (node.kind == "prim::ListConstruct") {
    for (ValueId e : node.inputs) out.push_back(constantInt(g, e));
    return out;
  }
  if (node.kind == "prim::Constant") {
    const core::Attribute* a = node.findAttribute("value");
    if (a == nullptr || !std::holds_alternative<std::vector<int64_t>>(a->value)) return std::nullopt;
    for (int64_t e : std::get<std::vector<int64_t>>(a->value)) out.push_back(e);
    return out;
  }
  return std::nullopt;
}

int normDim(int64_t d, size_t rank) {
  return static_cast<int>(d < 0 ? d + static_cast<int64_t>(rank) : d);
}

// The value an int computed at run time had when the graph was recorded, where it follows from
// constants and recorded sizes other than a batch dimension's (TorchScript traces
// `b, s, h = x.shape` as aten::size, and `h + kv` through prim::NumToTensor, aten::add and
// aten::Int); nullopt otherwise. Safe to bake in as a constant: no batch size is read.
std::optional<int64_t> recordedInt(const Graph& g, ValueId v, int depth = 0) {
  if (std::optional<int64_t> c = constantInt(g, v)) return c;
  const NodeId p = g.producer(v);
  if (p == core::kNoNode || depth > 16) return std::nullopt;
  const core::Node& node = g.node(p);
  if (node.kind == "prim::Constant") {  // a traced int: a one-element int64 tensor
    const core::Attribute* a = node.findAttribute("value");
    const auto* t = a == nullptr ? nullptr : std::get_if<core::TensorData>(&a->value);
    if (t == nullptr || t->dtype != core::DType::Int64 || t->bytes.size() != sizeof(int64_t))
      return std::nullopt;
    int64_t value = 0;
    std::memcpy(&value, t->bytes.data(), sizeof value);
    return value;
  }
  const auto operand = [&](size_t i) -> std::optional<int64_t> {
    return i < node.inputs.size() ? recordedInt(g, node.inputs[i], depth + 1) : std::nullopt;
  };
  if (isKind(node, {"prim::NumToTensor", "aten::Int", "aten::ScalarImplicit", "aten::IntImplicit"}))
    return operand(0);
  if (isKind(node, {"aten::size"}) && node.inputs.size() == 2) {
    const core::Value& t = g.value(node.inputs[0]);
    const std::optional<int64_t> d = constantInt(g, node.inputs[1]);
    if (!d || !t.type.isTensor() || !t.type.shapeKnown()) return std::nullopt;
    const std::vector<int64_t>& shape = t.type.shape();
    const int k = normDim(*d, shape.size());
    const bool batch = (t.cls == core::ValueClass::Batch || t.cls == core::ValueClass::Loss) &&
                       !t.type.notBatchMajor() && k == 0;
    if (k < 0 || k >= static_cast<int>(shape.size()) || batch) return std::nullopt;
    return shape[k];
  }
  if (isKind(node,
             {"aten::add", "aten::sub", "aten::mul", "aten::floordiv", "aten::floor_divide"})) {
    const std::optional<int64_t> a = operand(0), b = operand(1);
    if (!a || !b) return std::nullopt;
    const std::optional<int64_t> alpha = node.inputs.size() > 2 ? operand(2) : int64_t{1};
    if (isKind(node, {"aten::add"}))
      return alpha ? std::optional<int64_t>(*a + *alpha * *b) : std::nullopt;
    if (isKind(node, {"aten::sub"}))
      return alpha ? std::optional<int64_t>(*a - *alpha * *b) : std::nullopt;
    if (isKind(node, {"aten::mul"})) return *a * *b;
    return *b != 0 && *a >= 0 && *b > 0 ? std::optional<int64_t>(*a / *b) : std::nullopt;
  }
  return std::nullopt;
}

// The entries of an int-list argument as recordedInt gives them.
std::optional<std::vector<std::optional<int64_t>>> recordedEntries(const Graph& g, ValueId list) {
  const NodeId p = g.producer(list);
  if (p != core::kNoNode && g.node(p).kind == "prim::ListConstruct") {
    std::vector<std::optional<int64_t>> out;
    for (ValueId e : g.node(p).inputs) out.push_back(recordedInt(g, e));
    return out;
  }
  return listEntries(g, list);
}

}  // namespace

bool transposes2d(const Graph& g, NodeId n) {
  const core::Node& node = g.node(n);
  if (node.inputs.empty() || node.outputs.size() != 1) return false;
  const core::Type& in = g.value(node.inputs[0]).type;
  if (!in.isTensor() || !in.shapeKnown() || in.shape().size() != 2) return false;
  if (isKind(node, {"aten::t", "aten::numpy_T"})) return true;
  if (isKind(node, {"aten::transpose"}) && node.inputs.size() == 3) {
    const std::optional<int64_t> a = constantInt(g, node.inputs[1]),
                                 b = constantInt(g, node.inputs[2]);
    return a && b && normDim(*a, 2) != normDim(*b, 2);
  }
  if (isKind(node, {"aten::permute"}) && node.inputs.size() == 2) {
    const auto dims = listEntries(g, node.inputs[1]);
    return dims && dims->size() == 2 && (*dims)[0] && (*dims)[1] && normDim(*(*dims)[0], 2) == 1 &&
           normDim(*(*dims)[1], 2) == 0;
  }
  return false;
}

namespace {

struct Failure {
  std::string reason;
};

const std::vector<int64_t>& shapeOf(const Graph& g, ValueId v) {
  const core::Type& t = g.value(v).type;
  if (!t.isTensor() || !t.shapeKnown())
    throw Failure{"value " + g.value(v).name + " has no recorded shape"};
  return t.shape();
}

int64_t product(const std::vector<int64_t>& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

// `sections` equal cut parts of `extent` indices (none named for one).
std::vector<ShardPart> equalParts(int64_t extent, int64_t sections) {
  if (sections <= 1) return {};
  return std::vector<ShardPart>(static_cast<size_t>(sections), ShardPart{extent / sections, false});
}

class Planner {
 public:
  // `stage`: per node of `g`, whether the stage holds it.
  Planner(const Graph& g, const std::vector<char>& stage, int degree)
      : g_(g), stage_(stage), degree_(degree) {}

  // `whole`: column linears kept whole (Note [Whole K/V heads]); `wholeParts`: a fused
  // projection's parts narrower than its widest kept whole (Note [Fused parts]).
  PatternPlan plan(const decomposer::ShardPattern& pattern, const std::set<NodeId>& whole = {},
                   bool wholeParts = false) {
    PatternPlan p;
    wholeParts_ = wholeParts;
    unequalParts_ = false;
    elements_.clear();
    cut_.clear();
    pattern_ = std::set<NodeId>(pattern.nodes.begin(), pattern.nodes.end());
    p.row = pattern.rowLinear;
    p.wholeColumns = whole;
    for (NodeId n : pattern.nodes)
      if (n != pattern.rowLinear && !whole.count(n) && decomposer::isLinearNode(g_, n))
        p.columns.insert(n);
    if (p.columns.empty()) throw Failure{"no column-parallel linear"};
    for (NodeId n : pattern.nodes) {
      if (n == pattern.tiedEmbedding) continue;  // runs as tp_embedding of the same rows
      if (whole.count(n))
        wholeColumn(p, n);
      else if (p.columns.count(n))
        column(p, n);
      else if (n == p.row) row(p, n);
      else if (pattern.vocabulary != decomposer::ShardPattern::Vocabulary::Head ||
               !vocabularyLoss(p, n))
        follow(p, n);
    }
    for (const auto& [param, origin] : p.paramOrigin) partsFollow(p, param, origin);
    for (ValueId v : p.partial)
      if (p.params.count(v))
        throw Failure{"parameter " + g_.value(v).name + " is read both sliced and whole"};
    return p;
  }

 private:
  // A parameter sliced along `dim`: a graph input read by nothing but the pattern (through
  // transposes, transposes2d, whose readers are in the pattern). `sections` equal parts; a
  // fused projection's own weight and bias (PatternPlan::paramOrigin) are checked when its
  // parts are known (partsFollow) where `divisible` is false.
  void shardParam(PatternPlan& p, ValueId param, int dim, int64_t sections, bool divisible = true) {
    readByPatternAlone(param);
    const std::vector<int64_t>& s = shapeOf(g_, param);
    if (divisible && s.at(dim) % (sections * degree_) != 0)
      throw Failure{"parameter " + g_.value(param).name + " has " + std::to_string(s[dim]) +
                    " rows/columns, not divisible by " + std::to_string(sections * degree_)};
    auto [it, added] =
        p.params.emplace(param, ParamShard{param, dim, equalParts(s.at(dim), sections)});
    if (!added && (it->second.dim != dim))
      throw Failure{"parameter " + g_.value(param).name + " is split two ways"};
  }

  // A column linear's own weight or bias takes its parts (Note [Fused parts]); one without
  // parts is cut in equal slices.
  void partsFollow(PatternPlan& p, ValueId param, NodeId origin) {
    ParamShard& shard = p.params.at(param);
    const int64_t extent = shapeOf(g_, param).at(shard.dim);
    auto it = p.parts.find(origin);
    if (it == p.parts.end()) {
      if (extent % degree_ != 0)
        throw Failure{"parameter " + g_.value(param).name + " has " + std::to_string(extent) +
                      " rows/columns, not divisible by " + std::to_string(degree_)};
      return;
    }
    int64_t total = 0;
    bool whole = false;
    for (const ShardPart& part : it->second) {
      total += part.size;
      whole |= part.whole;
    }
    if (total != extent)
      throw Failure{"parameter " + g_.value(param).name + " has " + std::to_string(extent) +
                    " rows/columns where the parts of " + core::nodeLabel(g_, origin) +
                    " add up to " + std::to_string(total)};
    if (whole && shard.dim != 0)
      throw Failure{"parameter " + g_.value(param).name +
                    " would hold whole parts along its columns (dimension " +
                    std::to_string(shard.dim) + "); a part's gradient is summed by rows"};
    shard.parts = it->second;
  }

  // `param` is a parameter of the model that only the pattern reads (directly, or through a
  // transpose, transposes2d, whose readers are in the pattern).
  void readByPatternAlone(ValueId param) {
    if (g_.producer(param) != core::kNoNode || g_.value(param).cls != core::ValueClass::Param)
      throw Failure{"value " + g_.value(param).name + " is not a parameter of the model"};
    for (NodeId c : g_.consumers(param)) {
      if (pattern_.count(c)) continue;
      const core::Node& n = g_.node(c);
      bool viaTranspose = transposes2d(g_, c) && stage_[c];
      for (NodeId cc : viaTranspose ? g_.consumers(n.outputs.at(0)) : std::vector<NodeId>{})
        if (!pattern_.count(cc)) viaTranspose = false;
      if (!viaTranspose)
        throw Failure{"parameter " + g_.value(param).name + " is also read by " +
                      core::nodeLabel(g_, c)};
    }
  }

  // The weight of a linear node and the dimension of it that holds `outputSide` (true: the
  // output features) in storage order. Through a transpose (transposes2d), the graph input
  // behind it.
  std::pair<ValueId, int> weightOf(NodeId n, bool outputSide) {
    const core::Node& node = g_.node(n);
    if (isKind(node, {"aten::linear"})) return {node.inputs.at(1), outputSide ? 0 : 1};
    ValueId w = isKind(node, {"aten::addmm"}) ? node.inputs.at(2) : node.inputs.at(1);
    if (g_.value(w).cls != core::ValueClass::Param)
      throw Failure{core::nodeLabel(g_, n) + " has no parameter as its second operand"};
    const NodeId t = g_.producer(w);
    if (t == core::kNoNode) return {w, outputSide ? 1 : 0};  // [in, out]
    if (transposes2d(g_, t) && g_.producer(g_.node(t).inputs.at(0)) == core::kNoNode)
      return {g_.node(t).inputs.at(0), outputSide ? 0 : 1};
    throw Failure{core::nodeLabel(g_, n) + " reads its weight through " + core::nodeLabel(g_, t)};
  }

  void requireOnes(NodeId n, std::initializer_list<int> inputs) {
    for (int i : inputs) {
      std::optional<int64_t> c = constantInt(g_, g_.node(n).inputs.at(i));
      if (!c || *c != 1) throw Failure{core::nodeLabel(g_, n) + " scales by beta/alpha other than 1"};
    }
  }

  // A column-parallel linear. Its features' divisibility is checked when its parts are known
  // (partsFollow: a fused projection's whole parts need not divide).
  void column(PatternPlan& p, NodeId n) {
    const core::Node& node = g_.node(n);
    auto [w, dim] = weightOf(n, true);
    shardParam(p, w, dim, 1, false);
    p.paramOrigin[w] = n;
    if (isKind(node, {"aten::linear"}) && !isNone(g_, node.inputs.at(2))) {
      shardParam(p, node.inputs.at(2), 0, 1, false);
      p.paramOrigin[node.inputs.at(2)] = n;
    }
    if (isKind(node, {"aten::addmm"})) {
      requireOnes(n, {3, 4});
      const ValueId b = node.inputs.at(0);
      if (shapeOf(g_, b).size() != 1) throw Failure{core::nodeLabel(g_, n) + " adds a bias that is not 1-D"};
      shardParam(p, b, 0, 1, false);
      p.paramOrigin[b] = n;
    }
    const ValueId out = node.outputs.at(0);
    const std::vector<int64_t>& s = shapeOf(g_, out);
    if (!wholeParts_ && s.back() % degree_ != 0)
      throw Failure{core::nodeLabel(g_, n) + " has " + std::to_string(s.back()) +
                    " output features, not divisible by " + std::to_string(degree_)};
    p.split[out] = Split{static_cast<int>(s.size()) - 1, s.back(), n};
  }

  // A column linear kept whole (Note [Whole K/V heads]): its parameters are partial.
  void wholeColumn(PatternPlan& p, NodeId n) {
    const core::Node& node = g_.node(n);
    std::vector<ValueId> params{weightOf(n, true).first};
    if (isKind(node, {"aten::linear"}) && !isNone(g_, node.inputs.at(2)))
      params.push_back(node.inputs.at(2));
    if (isKind(node, {"aten::addmm"})) {
      requireOnes(n, {3, 4});
      params.push_back(node.inputs.at(0));
    }
    for (ValueId param : params) {
      readByPatternAlone(param);
      if (g_.value(param).type.requiresGrad()) p.partial.insert(param);
    }
    p.whole.insert(node.outputs.at(0));
  }

  // A node reading whole values and no split one (Note [Whole K/V heads]): it runs as it is and
  // its outputs are whole; its other tensor operands broadcast as a split node's do, and a size
  // computed at run time becomes its recorded constant.
  void wholeNode(PatternPlan& p, NodeId n) {
    const core::Node& node = g_.node(n);
    for (ValueId v : node.inputs)
      if (!p.whole.count(v) && g_.value(v).type.isTensor()) broadcastOperand(p, n, v);
    if (isKind(node, {"aten::view", "aten::reshape", "aten::_unsafe_view", "aten::expand",
                      "aten::broadcast_to"}) &&
        node.inputs.size() > 1 && g_.value(node.inputs[1]).type.kind() == core::TypeKind::List)
      rewriteSizes(p, n, 1, -1, node.outputs.at(0));
    for (ValueId out : node.outputs)
      if (g_.value(out).type.isTensor() || g_.value(out).type.kind() == core::TypeKind::List)
        p.whole.insert(out);
  }

  void row(PatternPlan& p, NodeId n) {
    const core::Node& node = g_.node(n);
    const ValueId x = decomposer::linearActivation(g_, n);
    auto it = p.split.find(x);
    const std::vector<int64_t>& s = shapeOf(g_, x);
    if (it == p.split.end() || it->second.dim != static_cast<int>(s.size()) - 1 ||
        it->second.size != s.back())
      throw Failure{"the input of " + core::nodeLabel(g_, n) + " is not split along its features"};
    auto [w, dim] = weightOf(n, false);
    shardParam(p, w, dim, 1);
    if (isKind(node, {"aten::addmm"})) requireOnes(n, {3, 4});
  }

  // The split `in` (of a value of rank `inRank`) seen in an output of rank `outRank` whose
  // dimensions line up from the right (broadcasting).
  static Split aligned(const Split& in, size_t inRank, size_t outRank) {
    Split out = in;
    out.dim = in.dim + static_cast<int>(outRank) - static_cast<int>(inRank);
    return out;
  }

  // Joins the splits of a node's tensor operands, aligned to an output of rank `rank`; operands
  // that are not split must broadcast over the split dimension, or be parameters sliced too.
  Split joinOperands(PatternPlan& p, NodeId n, const std::vector<int>& operands, size_t rank) {
    const core::Node& node = g_.node(n);
    std::optional<Split> joined;
    int64_t extent = 0;  // of the split dimension, unsplit
    for (int i : operands) {
      const ValueId v = node.inputs.at(i);
      auto it = p.split.find(v);
      if (it == p.split.end()) continue;
      Split s = aligned(it->second, shapeOf(g_, v).size(), rank);
      if (joined && (joined->dim != s.dim || joined->size != s.size))
        throw Failure{core::nodeLabel(g_, n) + " combines tensors split differently"};
      joined = s;
      extent = shapeOf(g_, v).at(it->second.dim);
    }
    if (!joined) throw Failure{core::nodeLabel(g_, n) + " reads no split tensor"};
    for (int i : operands) {
      const ValueId v = node.inputs.at(i);
      if (p.split.count(v) || !g_.value(v).type.isTensor()) continue;
      const std::vector<int64_t>& s = shapeOf(g_, v);
      const int d = joined->dim - static_cast<int>(rank - s.size());
      if (p.whole.count(v)) {  // Note [Whole K/V heads]
        if (d >= 0 && s[d] == extent)
          p.slices[{n, i}] = Split{d, joined->size, joined->origin};
        else if (d >= 0 && s[d] != 1)
          throw Failure{core::nodeLabel(g_, n) + " reads " + g_.value(v).name +
                        ", kept whole, with " + std::to_string(s[d]) +
                        " entries along the split dimension of " + std::to_string(extent)};
        continue;  // else broadcast: each member's gradient of it is its heads' share
      }
      if (d < 0 || s[d] == 1) {  // broadcast over the split dimension
        broadcastOperand(p, n, v);
        continue;
      }
      if (g_.value(v).cls == core::ValueClass::Param && s[d] % joined->size == 0) {
        // A bias added to a fused projection's whole output is cut in its parts, as the
        // projection is (its parts set once its cut is seen: partsFollow).
        const std::vector<int64_t>& width = shapeOf(g_, g_.node(joined->origin).outputs.at(0));
        const bool follows = s[d] == joined->size && joined->size == width.back();
        shardParam(p, v, d, s[d] / joined->size, !follows);
        if (follows) p.paramOrigin[v] = joined->origin;
        continue;
      }
      std::set<NodeId> chain;
      if (d >= 0 && s[d] == extent && gradientLeaves(v, chain).empty()) {
        // Computed alike on every member and needing no gradient (MPT's and BLOOM's ALiBi
        // bias, one slope per head): each member reads its heads' part (Note [Whole K/V heads]'s
        // tp_slice).
        p.slices[{n, i}] = Split{d, joined->size, joined->origin};
        continue;
      }
      throw Failure{core::nodeLabel(g_, n) + " reads " + g_.value(v).name +
                    ", which is not split, across the split dimension"};
    }
    return *joined;
  }

  // `v`, read by node `n` of the pattern unsplit and broadcast over the split dimension: each
  // member's gradient of it is its heads' share. A parameter read by the pattern alone is summed
  // over the group (PatternPlan::partial); values that need no gradient (masks, position
  // factors from buffers and the model's inputs) are fine; a value computed from a parameter
  // (or from the activations) would send a share into replicated nodes, which take their
  // gradient from one member: the pattern stays replicated.
  void broadcastOperand(PatternPlan& p, NodeId n, ValueId v) {
    const core::Value& value = g_.value(v);
    if (g_.producer(v) == core::kNoNode) {
      if (value.cls != core::ValueClass::Param || !value.type.requiresGrad()) return;
      for (NodeId c : g_.consumers(v))
        if (!pattern_.count(c))
          throw Failure{"parameter " + value.name + ", read by " + core::nodeLabel(g_, n) +
                        " across the split dimension, is also read by " + core::nodeLabel(g_, c)};
      p.partial.insert(v);
      return;
    }
    std::set<NodeId> chain;
    const std::vector<ValueId> leaves = gradientLeaves(v, chain);
    if (leaves.empty()) return;
    // Note [Parameters computed into an operand]: a parameter reaching the operand through
    // nodes outside the pattern (Gemma-3's norm scale 1 + w, in float32) is partial as one read
    // directly is: those nodes run alike on every member, so a member's gradient of the
    // parameter is its heads' share, and the group sums them. Only where the parameter and all
    // that is computed from it are read by those nodes and the pattern alone (else the other
    // reads' gradients would be summed too).
    const std::string read = core::nodeLabel(g_, n) + " reads " + value.name + ", computed from " +
                             g_.value(leaves.front()).name + ", across the split dimension: ";
    if (chain.size() > kMaxParameterChain)
      throw Failure{read + "its gradient would come back split by heads"};
    std::set<ValueId> computed(leaves.begin(), leaves.end());
    for (NodeId c : chain)  // ascending: node order is topological
      for (ValueId in : g_.node(c).inputs)
        if (computed.count(in)) {
          for (ValueId out : g_.node(c).outputs) computed.insert(out);
          break;
        }
    for (ValueId u : computed)
      for (NodeId c : g_.consumers(u))
        if (!pattern_.count(c) && !chain.count(c))
          throw Failure{read + g_.value(u).name + " is also read by " + core::nodeLabel(g_, c)};
    for (ValueId leaf : leaves) {
      if (g_.value(leaf).cls != core::ValueClass::Param)
        throw Failure{read + "its gradient would come back split by heads"};
      p.partial.insert(leaf);
    }
  }

  // The inputs of the graph that need a gradient (parameters) value `v` is computed from, and in
  // `chain` the nodes computing it; once one is found, the walk stops past kMaxParameterChain
  // nodes (the operand is then refused: a hidden state's whole past is not walked).
  std::vector<ValueId> gradientLeaves(ValueId v, std::set<NodeId>& chain) const {
    std::vector<ValueId> leaves, stack{v};
    std::set<ValueId> seen{v};
    while (!stack.empty() && (leaves.empty() || chain.size() <= kMaxParameterChain)) {
      const ValueId u = stack.back();
      stack.pop_back();
      const NodeId producer = g_.producer(u);
      if (producer == core::kNoNode) {
        if (g_.value(u).type.requiresGrad()) leaves.push_back(u);
        continue;
      }
      chain.insert(producer);
      for (ValueId in : g_.node(producer).inputs)
        if (seen.insert(in).second) stack.push_back(in);
    }
    std::sort(leaves.begin(), leaves.end());
    return leaves;
  }

  const Split& splitOf(const PatternPlan& p, NodeId n, ValueId v) {
    auto it = p.split.find(v);
    if (it == p.split.end())
      throw Failure{core::nodeLabel(g_, n) + " reads " + g_.value(v).name + ", which is not split"};
    return it->second;
  }

  void setOutputs(PatternPlan& p, NodeId n, const Split& s) {
    for (ValueId out : g_.node(n).outputs)
      if (g_.value(out).type.isTensor() || g_.value(out).type.kind() == core::TypeKind::List)
        p.split[out] = s;
  }

  void notAlong(NodeId n, const Split& s, int64_t dim, size_t rank) {
    if (normDim(dim, rank) == s.dim)
      throw Failure{core::nodeLabel(g_, n) + " works along the split dimension"};
  }

  int64_t intInput(NodeId n, int i) {
    std::optional<int64_t> c = constantInt(g_, g_.node(n).inputs.at(i));
    if (!c) throw Failure{core::nodeLabel(g_, n) + " takes a dimension computed at run time"};
    return *c;
  }

  // A view, reshape or flatten: where the split lands in the output, and its size there
  // rewritten in the sizes of input `sizesInput` (-1: a flatten, whose output sizes follow).
  // A view of a fused projection's output that gives its features a leading dimension of their
  // own cuts them into that many equal parts (Note [Fused parts]: ModernBERT's Wqkv viewed into
  // (3, heads, features)).
  void view(PatternPlan& p, NodeId n, const Split& in, int sizesInput) {
    if (viewSplit(p, n, in, sizesInput)) return;
    const ValueId x = g_.node(n).inputs.at(0);
    const int64_t sections = leadingSections(n, in);
    if (sections > 1 && !p.parts.count(in.origin) && in.size == shapeOf(g_, x)[in.dim]) {
      cutParts(p, n, in, std::vector<int64_t>(sections, in.size / sections), x);
      if (viewSplit(p, n, Split{in.dim, in.size / sections, in.origin}, sizesInput)) return;
    }
    throw Failure{core::nodeLabel(g_, n) + " mixes the split dimension with another"};
  }

  // view's mapping of split `in` onto node n's output; false where no output dimension holds it.
  bool viewSplit(PatternPlan& p, NodeId n, const Split& in, int sizesInput) {
    const core::Node& node = g_.node(n);
    const std::vector<int64_t>& is = shapeOf(g_, node.inputs.at(0));
    const std::vector<int64_t>& os = shapeOf(g_, node.outputs.at(0));
    const int64_t stride = product(is, in.dim + 1, is.size());
    const int64_t outer = product(is, 0, is.size()) / (in.size * stride);
    for (size_t k = 0; k < os.size(); ++k) {
      const int64_t strideK = product(os, k + 1, os.size());
      const int64_t block = in.size * stride;
      if ((block / degree_) % strideK != 0 || (os[k] * strideK) % block != 0) continue;
      if (product(os, 0, k) * (os[k] * strideK / block) != outer) continue;
      Split out{static_cast<int>(k), block / strideK, in.origin};
      if (out.size % degree_ != 0) continue;
      if (sizesInput >= 0) rewriteSizes(p, n, sizesInput, static_cast<int>(k), node.outputs.at(0));
      setOutputs(p, n, out);
      return true;
    }
    return false;
  }

  // The size of the output dimension of view n where the block of split `in` begins, when it
  // begins one (it and the dimensions after it hold exactly the block), divides the block and is
  // not the whole of it; 0 otherwise.
  int64_t leadingSections(NodeId n, const Split& in) {
    const core::Node& node = g_.node(n);
    const std::vector<int64_t>& is = shapeOf(g_, node.inputs.at(0));
    const std::vector<int64_t>& os = shapeOf(g_, node.outputs.at(0));
    const int64_t block = in.size * product(is, in.dim + 1, is.size());
    const int64_t outer = product(is, 0, is.size()) / block;
    for (size_t k = 0; k < os.size(); ++k)
      if (product(os, 0, k) == outer && product(os, k, os.size()) == block)
        return os[k] > 1 && os[k] < in.size && in.size % os[k] == 0 ? os[k] : 0;
    return 0;
  }

  // The sizes (int-list input `i` of `n`) of an output of recorded shape `os` split at `k`:
  // entry k becomes os[k] / degree; -1 and other constants stay. A size computed at run time may
  // read a sharded tensor's size (GPT-2's `x.size(-1) // heads`), so in an output whose rows
  // follow the batch each one but the first becomes its recorded constant and the first -1
  // (Note [Heads merged with the batch]); elsewhere the pattern stays replicated.
  void rewriteSizes(PatternPlan& p, NodeId n, int i, int k, ValueId out) {
    const std::vector<int64_t>& os = shapeOf(g_, out);
    const ValueId list = g_.node(n).inputs.at(i);
    auto entries = listEntries(g_, list);
    if (!entries || entries->size() != os.size())
      throw Failure{core::nodeLabel(g_, n) + " takes its sizes as one value computed at run time"};
    const NodeId producer = g_.producer(list);
    if (g_.node(producer).kind == "prim::ListConstruct" && !stage_[producer])
      throw Failure{core::nodeLabel(g_, n) + " takes sizes built in another stage"};
    const core::Value& value = g_.value(out);
    const bool batchMajor = value.cls == core::ValueClass::Batch && !value.type.notBatchMajor();
    Rewrite& rewrite = p.rewrites[{n, i}];
    // Note [Heads merged with the batch]: the first size of a batch-major output, computed at
    // run time, may be computed from a split tensor's size (XGLM's `bmm(...).size(0) //
    // num_heads`), and the first dimension of a view may merge the batch with the heads
    // (fairseq's and XGLM's `view(bsz * num_heads, -1, head_dim)`: the split lands in it), which
    // a member cannot compute from the batch. Where the other dimensions hold no batch rows (a
    // batch-major output; or the first dimension merging the first input dimensions of a
    // batch-major input), they take their recorded sizes (the split one's divided) and the first
    // becomes -1, inferred from the member's tensor (expand keeps it as the input has it: only
    // where the input has it already). Only there: elsewhere a first size computed from the
    // batch stays, so a layout this misreads (the TorchScript front end marks no value
    // not_batch_major) fails loudly at another batch size rather than inferring a wrong one.
    const ValueId in = g_.node(n).inputs.at(0);
    const std::vector<int64_t>& is = shapeOf(g_, in);
    const bool inputBatchMajor =
        g_.value(in).cls == core::ValueClass::Batch && !g_.value(in).type.notBatchMajor();
    bool merged = false;  // output dimension 0 is input dimensions [0, m) for some m
    for (size_t m = 1; m <= is.size() && !merged; ++m) merged = product(is, 0, m) == os.at(0);
    const bool inferable = !isKind(g_.node(n), {"aten::expand", "aten::broadcast_to"}) ||
                           (is.size() == os.size() && is[0] == os[0]);
    const NodeId listProducer = g_.producer(list);
    const bool firstReadsSplit = listProducer != core::kNoNode &&
                                 g_.node(listProducer).kind == "prim::ListConstruct" &&
                                 readsSplitSize(p, g_.node(listProducer).inputs.at(0), 8);
    if (value.cls == core::ValueClass::Batch && !(*entries)[0] && inferable &&
        ((batchMajor && firstReadsSplit) || (k == 0 && inputBatchMajor && merged))) {
      for (size_t j = 1; j < os.size(); ++j) {
        const std::optional<int64_t> e = (*entries)[j];
        if (e && *e != -1 && *e != os[j])
          throw Failure{core::nodeLabel(g_, n) +
                        " has a size that does not match its recorded shape"};
        const int64_t want = static_cast<int>(j) == k ? os[j] / degree_ : os[j];
        if (e != want) rewrite[static_cast<int>(j)] = want;
      }
      rewrite[0] = -1;
      return;
    }
    if (batchMajor && k == 0) throw Failure{core::nodeLabel(g_, n) + " splits the batch dimension"};
    for (size_t j = 0; j < os.size(); ++j) {
      const std::optional<int64_t> e = (*entries)[j];
      if (e && *e == -1) continue;
      const int64_t want = static_cast<int>(j) == k ? os[j] / degree_ : os[j];
      if (e) {
        if (*e != os[j])
          throw Failure{core::nodeLabel(g_, n) + " has a size that does not match its recorded shape"};
        if (want != *e) rewrite[static_cast<int>(j)] = want;
      } else if (batchMajor && j > 0) {
        rewrite[static_cast<int>(j)] = want;
      } else if (!batchMajor || static_cast<int>(j) == k) {
        throw Failure{core::nodeLabel(g_, n) + " takes a size computed at run time"};
      }
    }
  }

  // Whether int value `v` is computed, through at most `depth` nodes, from the size of a tensor
  // the plan splits.
  bool readsSplitSize(const PatternPlan& p, ValueId v, int depth) {
    const NodeId producer = g_.producer(v);
    if (producer == core::kNoNode || depth == 0) return false;
    for (ValueId in : g_.node(producer).inputs)
      if (p.split.count(in) || (!g_.value(in).type.isTensor() && readsSplitSize(p, in, depth - 1)))
        return true;
    return false;
  }

  void splitParts(PatternPlan& p, NodeId n, const Split& in) {
    const core::Node& node = g_.node(n);
    const size_t rank = shapeOf(g_, node.inputs.at(0)).size();
    const int64_t dim = intInput(n, 2);
    if (normDim(dim, rank) != in.dim) {  // split along another dimension: every part as split
      setOutputs(p, n, in);
      return;
    }
    // A fused projection: each part is one projection, sliced on its own (Note [Fused parts]).
    // TorchScript records `split([a, b, c])` as aten::split of a list.
    const bool listed = isKind(node, {"aten::split_with_sizes"}) ||
                        g_.value(node.inputs.at(1)).type.kind() == core::TypeKind::List;
    std::vector<int64_t> sizes;
    if (isKind(node, {"aten::chunk", "aten::unsafe_chunk"})) {
      const int64_t k = intInput(n, 1);
      if (k <= 0 || in.size % k != 0) throw Failure{core::nodeLabel(g_, n) + " makes unequal chunks"};
      sizes.assign(k, in.size / k);
    } else if (listed) {
      // Sizes computed at run time from recorded sizes become constants (all are rewritten).
      auto entries = recordedEntries(g_, node.inputs.at(1));
      if (!entries) throw Failure{core::nodeLabel(g_, n) + " takes sizes computed at run time"};
      for (const std::optional<int64_t>& e : *entries) {
        if (!e) throw Failure{core::nodeLabel(g_, n) + " takes sizes computed at run time"};
        sizes.push_back(*e);
      }
    } else {
      const int64_t size = intInput(n, 1);
      if (size <= 0 || in.size % size != 0) throw Failure{core::nodeLabel(g_, n) + " makes unequal parts"};
      sizes.assign(in.size / size, size);
    }
    const std::vector<ShardPart> parts = cutParts(p, n, in, sizes, node.inputs.at(0));
    if (listed) {
      for (size_t k = 0; k < parts.size(); ++k)
        p.rewrites[{n, 1}][static_cast<int>(k)] =
            parts[k].whole ? parts[k].size : parts[k].size / degree_;
    } else if (isKind(node, {"aten::split", "aten::unsafe_split"})) {
      p.rewrites[{n, 1}][-1] = sizes.front() / degree_;
    }
    // One output per part (torch.export), or one list (TorchScript: unpacked by ListUnpack).
    std::vector<std::optional<Split>> each;
    for (const ShardPart& part : parts)
      each.push_back(part.whole ? std::nullopt
                                : std::optional<Split>(Split{in.dim, part.size, in.origin}));
    if (node.outputs.size() == parts.size()) {
      for (size_t k = 0; k < parts.size(); ++k) partOutput(p, node.outputs[k], each[k]);
    } else if (node.outputs.size() == 1) {
      elements_[node.outputs[0]] = each;
      const bool equal = std::all_of(parts.begin(), parts.end(), [&](const ShardPart& part) {
        return !part.whole && part.size == parts.front().size;
      });
      if (equal) p.split[node.outputs[0]] = *each.front();  // the list, for its other readers
    } else {
      throw Failure{core::nodeLabel(g_, n) + " has " + std::to_string(node.outputs.size()) +
                    " outputs for " + std::to_string(parts.size()) + " parts"};
    }
  }

  // Value `v` is a part: split as `s`, or whole.
  void partOutput(PatternPlan& p, ValueId v, const std::optional<Split>& s) {
    if (s)
      p.split[v] = *s;
    else
      p.whole.insert(v);
  }

  // The parts of `sizes` (adding up to the split dimension) that node `n` cuts `x`, the output
  // of fused projection in.origin, into (Note [Fused parts]): each cut, or with wholeParts_ whole
  // where narrower than the widest.
  std::vector<ShardPart> cutParts(PatternPlan& p, NodeId n, const Split& in,
                                  const std::vector<int64_t>& sizes, ValueId x) {
    if (p.parts.count(in.origin) || in.size != shapeOf(g_, x)[in.dim])
      throw Failure{core::nodeLabel(g_, n) + " splits a tensor already cut in parts"};
    cut_[in.origin] = x;
    const int64_t widest = *std::max_element(sizes.begin(), sizes.end());
    std::vector<ShardPart> parts;
    bool plain = true;  // equal parts, every one cut
    for (int64_t size : sizes) {
      parts.push_back(ShardPart{size, wholeParts_ && size < widest});
      plain &= size == widest && !parts.back().whole;
      if (size < widest) unequalParts_ = true;
      if (!parts.back().whole && size % degree_ != 0)
        throw Failure{core::nodeLabel(g_, n) + " makes a part of " + std::to_string(size) +
                      ", not divisible by " + std::to_string(degree_)};
    }
    if (!plain) {
      const std::vector<int64_t>& width = shapeOf(g_, g_.node(in.origin).outputs.at(0));
      if (in.dim != static_cast<int>(shapeOf(g_, x).size()) - 1 || in.size != width.back())
        throw Failure{core::nodeLabel(g_, n) + " cuts parts of unequal sizes after a view of " +
                      core::nodeLabel(g_, in.origin) + "'s features"};
      for (NodeId c : g_.consumers(x))
        if (!isKind(g_.node(c), {"aten::slice", "aten::split", "aten::split_with_sizes"}) &&
            g_.value(g_.node(c).outputs.at(0)).type.isTensor())
          throw Failure{core::nodeLabel(g_, c) + " reads " + g_.value(x).name +
                        " beside the cut into parts"};
    }
    p.parts[in.origin] = parts;
    return parts;
  }

  // The bounds [start, end) of slice node `n` along dimension `dim` of a tensor of `extent`
  // indices there, all constants with step 1; nullopt otherwise (or along another dimension).
  std::optional<std::pair<int64_t, int64_t>> sliceBounds(NodeId n, int dim, int64_t extent) {
    const core::Node& node = g_.node(n);
    if (!isKind(node, {"aten::slice"}) || node.inputs.size() != 5) return std::nullopt;
    const size_t rank = shapeOf(g_, node.inputs[0]).size();
    const std::optional<int64_t> d = constantInt(g_, node.inputs[1]);
    if (!d || normDim(*d, rank) != dim || constantInt(g_, node.inputs[4]) != int64_t{1})
      return std::nullopt;
    const auto bound = [&](ValueId v, int64_t none) -> std::optional<int64_t> {
      if (isNone(g_, v)) return none;
      std::optional<int64_t> b = recordedInt(g_, v);
      if (!b) return std::nullopt;
      if (*b < 0) *b += extent;
      return std::clamp<int64_t>(*b, 0, extent);
    };
    const std::optional<int64_t> start = bound(node.inputs[2], 0),
                                 end = bound(node.inputs[3], extent);
    if (!start || !end || *end <= *start) return std::nullopt;
    return std::make_pair(*start, *end);
  }

  // A slice along the split dimension of a fused projection's output, one of the slices that
  // cut it into parts (Note [Fused parts], Phi-3's `qkv[..., :q]`, `qkv[..., q:q + kv]`, ...):
  // its output is its part, cut or whole, and its bounds become the member's.
  void slicePart(PatternPlan& p, NodeId n, const Split& in) {
    // TorchScript records `qkv[:, :, a:b]` as slices of every index along the dimensions before.
    ValueId x = g_.node(n).inputs.at(0);
    while (g_.producer(x) != core::kNoNode && wholeSlice(g_.producer(x)))
      x = g_.node(g_.producer(x)).inputs.at(0);
    const int64_t extent = shapeOf(g_, x)[in.dim];
    auto parts = p.parts.find(in.origin);
    if (parts != p.parts.end() && cut_.at(in.origin) != x)
      throw Failure{core::nodeLabel(g_, n) + " slices a part of " + core::nodeLabel(g_, in.origin) +
                    "'s output along the split dimension"};
    if (parts == p.parts.end()) {
      std::vector<std::pair<int64_t, int64_t>> bounds;
      std::vector<ValueId> stack{x};
      while (!stack.empty()) {
        const ValueId v = stack.back();
        stack.pop_back();
        for (NodeId c : g_.consumers(v)) {
          if (!g_.value(g_.node(c).outputs.at(0)).type.isTensor()) continue;
          if (wholeSlice(c)) {
            stack.push_back(g_.node(c).outputs.at(0));
            continue;
          }
          const auto b = sliceBounds(c, in.dim, extent);
          if (!b) throw Failure{core::nodeLabel(g_, n) + " works along the split dimension"};
          bounds.push_back(*b);
        }
      }
      std::sort(bounds.begin(), bounds.end());
      bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
      std::vector<int64_t> sizes;
      int64_t at = 0;
      for (const auto& [start, end] : bounds) {
        if (start != at)
          throw Failure{core::nodeLabel(g_, n) + " and the other slices of " + g_.value(x).name +
                        " do not cut it into parts"};
        sizes.push_back(end - start);
        at = end;
      }
      if (at != extent || sizes.size() < 2)
        throw Failure{core::nodeLabel(g_, n) + " and the other slices of " + g_.value(x).name +
                      " do not cut it into parts"};
      cutParts(p, n, in, sizes, x);
      parts = p.parts.find(in.origin);
    }
    const auto b = sliceBounds(n, in.dim, extent);
    if (!b) throw Failure{core::nodeLabel(g_, n) + " works along the split dimension"};
    int64_t start = 0, member = 0;  // in the whole value, in the member's
    for (const ShardPart& part : parts->second) {
      const int64_t held = part.whole ? part.size : part.size / degree_;
      if (start == b->first && part.size == b->second - b->first) {
        p.rewrites[{n, 2}][-1] = member;
        p.rewrites[{n, 3}][-1] = member + held;
        partOutput(
            p, g_.node(n).outputs.at(0),
            part.whole ? std::nullopt : std::optional<Split>(Split{in.dim, part.size, in.origin}));
        return;
      }
      start += part.size;
      member += held;
    }
    throw Failure{core::nodeLabel(g_, n) + " takes no one part of " + g_.value(x).name};
  }

  void follow(PatternPlan& p, NodeId n) {
    const core::Node& node = g_.node(n);
    std::vector<int> tensors;
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (g_.value(node.inputs[i]).type.isTensor()) tensors.push_back(static_cast<int>(i));
    const auto isSplit = [&](ValueId v) { return p.split.count(v) != 0; };
    const auto isWhole = [&](ValueId v) { return p.whole.count(v) != 0; };
    if (std::none_of(node.inputs.begin(), node.inputs.end(), isSplit) &&
        std::any_of(node.inputs.begin(), node.inputs.end(), isWhole)) {
      wholeNode(p, n);
      return;
    }
    if (isKind(node, {"prim::ListConstruct"})) {
      std::optional<Split> s;
      for (ValueId v : node.inputs) {
        auto it = p.split.find(v);
        if (it == p.split.end() || (s && (s->dim != it->second.dim || s->size != it->second.size)))
          throw Failure{core::nodeLabel(g_, n) + " lists tensors split differently"};
        s = it->second;
      }
      if (s) setOutputs(p, n, *s);
      return;
    }
    if (isKind(node, {"prim::ListUnpack"})) {
      auto parts = elements_.find(node.inputs.at(0));  // a fused projection's parts
      if (parts != elements_.end() && parts->second.size() == node.outputs.size()) {
        for (size_t k = 0; k < node.outputs.size(); ++k)
          partOutput(p, node.outputs[k], parts->second[k]);
        return;
      }
      setOutputs(p, n, splitOf(p, n, node.inputs.at(0)));
      return;
    }
    if (isKind(node, {"aten::cat"})) {
      const Split& s = splitOf(p, n, node.inputs.at(0));
      notAlong(n, s, intInput(n, 1), shapeOf(g_, node.outputs.at(0)).size());
      setOutputs(p, n, s);
      return;
    }
    const ValueId in0 = node.inputs.at(0);
    if (isKind(node, {"aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unsafe_split",
                      "aten::unsafe_chunk"})) {  // list outputs
      splitParts(p, n, splitOf(p, n, in0));
      return;
    }
    if (isKind(node, {"aten::unbind", "aten::select"})) {  // a dimension taken off (unbind: a
      Split s = splitOf(p, n, in0);                        // tensor each, or one list)
      const size_t inRank = shapeOf(g_, in0).size();
      const int d = normDim(intInput(n, 1), inRank);
      notAlong(n, s, d, inRank);
      if (d < s.dim) --s.dim;
      setOutputs(p, n, s);
      return;
    }
    const size_t outRank = shapeOf(g_, node.outputs.at(0)).size();
    if (isKind(node, {"aten::view", "aten::reshape", "aten::_unsafe_view"})) {
      view(p, n, splitOf(p, n, in0), 1);
      return;
    }
    if (isKind(node, {"aten::flatten"})) {
      view(p, n, splitOf(p, n, in0), -1);
      return;
    }
    if (isKind(node, {"aten::mean"})) {  // over other dimensions (each head's features)
      Split s = splitOf(p, n, in0);
      const size_t inRank = shapeOf(g_, in0).size();
      auto dims = node.inputs.size() > 2 ? listEntries(g_, node.inputs.at(1)) : std::nullopt;
      const std::optional<int64_t> keep =
          node.inputs.size() > 2 ? constantInt(g_, node.inputs[2]) : std::nullopt;
      if (!dims || dims->empty() || !keep)
        throw Failure{core::nodeLabel(g_, n) + " averages over dimensions not named"};
      int before = 0;
      for (const std::optional<int64_t>& d : *dims) {
        if (!d)
          throw Failure{core::nodeLabel(g_, n) + " averages over dimensions computed at run time"};
        notAlong(n, s, *d, inRank);
        before += normDim(*d, inRank) < s.dim;
      }
      if (*keep == 0) s.dim -= before;
      setOutputs(p, n, s);
      return;
    }
    if (isKind(node, {"aten::layer_norm"})) {  // of each head's features (Persimmon's q_layernorm)
      const Split& s = splitOf(p, n, in0);
      auto normalized = listEntries(g_, node.inputs.at(1));
      if (!normalized)
        throw Failure{core::nodeLabel(g_, n) + " normalizes over sizes computed at run time"};
      if (s.dim >= static_cast<int>(shapeOf(g_, in0).size() - normalized->size()))
        throw Failure{core::nodeLabel(g_, n) + " normalizes along the split dimension"};
      for (size_t i : {2, 3})  // weight and bias: of the features alone, read by every head
        if (node.inputs.size() > i && g_.value(node.inputs[i]).type.isTensor())
          broadcastOperand(p, n, node.inputs[i]);
      setOutputs(p, n, s);
      return;
    }
    if (isKind(node, {"aten::stack"})) {  // a new dimension: before the split one, it moves
      Split s = splitOf(p, n, in0);
      if (normDim(intInput(n, 1), outRank) <= s.dim) ++s.dim;
      setOutputs(p, n, s);
      return;
    }
    if (isKind(node, {"aten::permute"})) {
      const Split& s = splitOf(p, n, in0);
      auto dims = listEntries(g_, node.inputs.at(1));
      if (!dims) throw Failure{core::nodeLabel(g_, n) + " permutes by dimensions computed at run time"};
      for (size_t k = 0; k < dims->size(); ++k)
        if ((*dims)[k] && normDim(*(*dims)[k], outRank) == s.dim) {
          setOutputs(p, n, Split{static_cast<int>(k), s.size, s.origin});
          return;
        }
      throw Failure{core::nodeLabel(g_, n) + " permutes by dimensions computed at run time"};
    }
    if (isKind(node, {"aten::transpose"})) {
      Split s = splitOf(p, n, in0);
      const int a = normDim(intInput(n, 1), outRank), b = normDim(intInput(n, 2), outRank);
      if (s.dim == a) s.dim = b;
      else if (s.dim == b) s.dim = a;
      setOutputs(p, n, s);
      return;
    }
    if (isKind(node, {"aten::unsqueeze"})) {
      Split s = splitOf(p, n, in0);
      if (normDim(intInput(n, 1), outRank) <= s.dim) ++s.dim;
      setOutputs(p, n, s);
      return;
    }
    if (isKind(node, {"aten::squeeze"})) {
      Split s = splitOf(p, n, in0);
      const size_t inRank = shapeOf(g_, in0).size();
      if (node.inputs.size() < 2 || inRank != outRank + 1)
        throw Failure{core::nodeLabel(g_, n) + " squeezes dimensions not named"};
      const int d = normDim(intInput(n, 1), inRank);
      notAlong(n, s, d, inRank);
      if (d < s.dim) --s.dim;
      setOutputs(p, n, s);
      return;
    }
    if (isKind(node, {"aten::index"})) {  // Falcon's `qkv[:, :, :, [-2]]`
      indexAfter(p, n, splitOf(p, n, in0));
      return;
    }
    if (isKind(node, {"aten::expand", "aten::broadcast_to"})) {
      const Split s = aligned(splitOf(p, n, in0), shapeOf(g_, in0).size(), outRank);
      rewriteSizes(p, n, 1, s.dim, node.outputs.at(0));
      setOutputs(p, n, s);
      return;
    }
    if (isKind(node, {"aten::slice"}) && !wholeSlice(n)) {
      const Split s = splitOf(p, n, in0);
      if (normDim(intInput(n, 1), outRank) == s.dim)
        slicePart(p, n, s);  // Note [Fused parts]
      else
        setOutputs(p, n, s);
      return;
    }
    if (isKind(node, {"aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::slice"})) {
      const Split& s = splitOf(p, n, in0);
      if (!wholeSlice(n)) notAlong(n, s, intInput(n, 1), outRank);
      setOutputs(p, n, s);
      return;
    }
    if (isKind(node, {"aten::matmul", "aten::bmm"})) {
      matmul(p, n, {0, 1}, outRank);
      return;
    }
    if (isKind(node, {"aten::baddbmm"})) {  // the added input is a mask
      matmul(p, n, {1, 2}, outRank);
      setOutputs(p, n, joinOperands(p, n, {0, 1, 2}, outRank));
      return;
    }
    if (isKind(node, {"aten::scaled_dot_product_attention"})) {
      // enable_gqa (PyTorch 2.5+, the eighth argument): K and V of fewer heads than Q.
      const bool grouped = node.inputs.size() > 7 && constantInt(g_, node.inputs[7]) == int64_t{1};
      const Split s =
          grouped ? groupedHeads(p, n, outRank) : joinOperands(p, n, {0, 1, 2}, outRank);
      if (s.dim >= static_cast<int>(outRank) - 2)
        throw Failure{core::nodeLabel(g_, n) + " is split along its sequence or head features"};
      if (node.inputs.size() > 3 && g_.value(node.inputs[3]).type.isTensor())
        joinOperands(p, n, {0, 3}, outRank);
      setOutputs(p, n, s);
      return;
    }
    if (isKind(node, {"aten::type_as", "aten::to", "aten::_to_copy", "aten::contiguous",
                      "aten::clone", "aten::alias", "aten::dropout", "aten::neg", "aten::gelu",
                      "aten::relu", "aten::square", "aten::silu", "aten::tanh", "aten::sigmoid",
                      "aten::erf", "aten::exp", "aten::sqrt", "aten::rsqrt"})) {
      setOutputs(p, n, aligned(splitOf(p, n, in0), shapeOf(g_, in0).size(), outRank));
      return;
    }
    if (isKind(node, {"aten::add", "aten::sub", "aten::mul", "aten::div", "aten::pow",
                      "aten::maximum", "aten::minimum", "aten::masked_fill", "aten::where"}) ||
        (isKind(node, {"aten::max", "aten::min"}) && tensors.size() == 2)) {  // max.other
      setOutputs(p, n, joinOperands(p, n, tensors, outRank));
      return;
    }
    throw Failure{core::nodeLabel(g_, n) + ": its operator is not followed by the sharding"};
  }

  // Advanced indexing (aten::index) by tensors not computed from the pattern, along dimensions
  // after the split one only (None at it and before): those dimensions keep their places.
  void indexAfter(PatternPlan& p, NodeId n, const Split& in) {
    const core::Node& node = g_.node(n);
    const NodeId list = g_.producer(node.inputs.at(1));
    if (list == core::kNoNode || g_.node(list).kind != "prim::ListConstruct")
      throw Failure{core::nodeLabel(g_, n) + " indexes by a list computed at run time"};
    const std::vector<ValueId>& indices = g_.node(list).inputs;
    for (size_t d = 0; d < indices.size(); ++d) {
      const ValueId index = indices[d];
      if (isNone(g_, index)) continue;
      if (static_cast<int>(d) <= in.dim)
        throw Failure{core::nodeLabel(g_, n) + " indexes along or before the split dimension"};
      if (p.split.count(index) || p.whole.count(index) || pattern_.count(g_.producer(index)))
        throw Failure{core::nodeLabel(g_, n) + " indexes by a tensor the pattern computes"};
      broadcastOperand(p, n, index);
    }
    setOutputs(p, n, in);
  }

  // Note [Grouped sdpa]: scaled_dot_product_attention(q, k, v, ..., enable_gqa=True) reads K and V
  // of Hkv heads for Q's Hq (Q head h reads K/V head h / (Hq / Hkv)). Q is split by heads; K and
  // V split by heads too keep each member's heads in their groups (member j holds Q heads
  // [j Hq/t, (j+1) Hq/t) and K/V heads [j Hkv/t, (j+1) Hkv/t)). K and V kept whole (Note [Whole
  // K/V heads]) are sliced to the heads the member's Q heads read: Hkv/t of them where Hkv
  // divides by t, else the one head j Hkv / t that t / Hkv members share; one head is read as is.
  // Returns Q's split, the output's (the mask is joined by the caller).
  Split groupedHeads(PatternPlan& p, NodeId n, size_t outRank) {
    const core::Node& node = g_.node(n);
    const Split q =
        aligned(splitOf(p, n, node.inputs[0]), shapeOf(g_, node.inputs[0]).size(), outRank);
    if (q.dim != static_cast<int>(outRank) - 3)
      throw Failure{core::nodeLabel(g_, n) + " (enable_gqa) is split along other than its heads"};
    const int64_t heads = shapeOf(g_, node.inputs[0]).at(q.dim);
    for (int i : {1, 2}) {
      const ValueId v = node.inputs.at(i);
      const std::vector<int64_t>& shape = shapeOf(g_, v);
      const int d = q.dim - static_cast<int>(outRank - shape.size());
      const int64_t kv = d >= 0 ? shape[d] : 0;
      if (kv <= 0 || heads % kv != 0)
        throw Failure{core::nodeLabel(g_, n) + " (enable_gqa) reads " + g_.value(v).name +
                      " with " + std::to_string(kv) + " heads for " + std::to_string(heads) +
                      " query heads"};
      auto split = p.split.find(v);
      if (split != p.split.end()) {
        if (split->second.dim != d || split->second.size != kv || kv % degree_ != 0)
          throw Failure{core::nodeLabel(g_, n) + " (enable_gqa) reads " + g_.value(v).name +
                        " split otherwise than by its heads"};
        continue;
      }
      if (!p.whole.count(v))
        throw Failure{core::nodeLabel(g_, n) + " reads " + g_.value(v).name +
                      ", which is not split"};
      if (kv == 1) continue;  // every member's Q heads read it: as it is
      if (kv % degree_ != 0 && degree_ % kv != 0)
        throw Failure{core::nodeLabel(g_, n) + " (enable_gqa) reads " + g_.value(v).name +
                      ", kept whole, whose " + std::to_string(kv) +
                      " heads do not fall into the members' query heads evenly"};
      p.slices[{n, i}] = Split{d, kv, q.origin};
    }
    return q;
  }

  // An aten::slice taking every index (TorchScript records `t[:, :, None]` so; transformers'
  // repeat_kv reads K and V that way): the identity, along the split dimension too.
  bool wholeSlice(NodeId n) {
    const core::Node& node = g_.node(n);
    if (!isKind(node, {"aten::slice"}) || node.inputs.size() != 5) return false;
    const std::vector<int64_t>& in = shapeOf(g_, node.inputs[0]);
    const std::optional<int64_t> dim = constantInt(g_, node.inputs[1]);
    const int d = dim ? normDim(*dim, in.size()) : -1;
    if (d < 0 || d >= static_cast<int>(in.size())) return false;
    const std::optional<int64_t> start = constantInt(g_, node.inputs[2]),
                                 end = constantInt(g_, node.inputs[3]),
                                 step = constantInt(g_, node.inputs[4]);
    const bool fromFirst = isNone(g_, node.inputs[2]) || start == int64_t{0};
    const bool toLast = isNone(g_, node.inputs[3]) || (end && *end >= in[d]);
    return fromFirst && toLast && step == int64_t{1};
  }

  // An LM head's log-softmax along the split vocabulary, or its loss (Note [Vocabulary-parallel
  // loss]): recorded in p.vocabularyOps. False for any other node (follow's).
  bool vocabularyLoss(PatternPlan& p, NodeId n) {
    const core::Node& node = g_.node(n);
    const auto split = p.split.find(node.inputs.at(0));
    if (split == p.split.end()) return false;
    const Split& s = split->second;
    const size_t rank = shapeOf(g_, node.inputs.at(0)).size();
    if (isKind(node, {"aten::log_softmax", "aten::_log_softmax"})) {
      if (normDim(intInput(n, 1), rank) != s.dim) return false;
      const ValueId option = node.inputs.size() > 2 ? node.inputs[2] : -1;
      const bool plain = option < 0 || isNone(g_, option) || constantInt(g_, option) == int64_t{0};
      if (!plain) throw Failure{core::nodeLabel(g_, n) + " changes the dtype of the log-softmax"};
      p.vocabularyOps[n] = "tp_log_softmax";
      setOutputs(p, n, s);
      return true;
    }
    const std::string base = baseKind(node.kind);
    const bool crossEntropy = base == "aten::cross_entropy_loss" || base == "aten::cross_entropy";
    if (!crossEntropy && !isKind(node, {"aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss2d"}))
      return false;
    if (rank < 2 || s.dim != 1 || s.size != shapeOf(g_, node.inputs[0])[1])
      throw Failure{core::nodeLabel(g_, n) + " is not split along its classes (dimension 1)"};
    const ValueId target = node.inputs.at(1);
    const core::Type& targetType = g_.value(target).type;
    if (p.split.count(target) || !targetType.isTensor() || targetType.dtype() != core::DType::Int64)
      throw Failure{core::nodeLabel(g_, n) + " takes no int64 class indices (probabilities?)"};
    if (!isNone(g_, node.inputs.at(2)))
      throw Failure{core::nodeLabel(g_, n) + " weighs its classes"};
    for (int i : {3, 4}) (void)intInput(n, i);  // reduction and ignore_index: constants
    if (crossEntropy) {
      const NodeId smoothing = node.inputs.size() > 5 ? g_.producer(node.inputs[5]) : core::kNoNode;
      if (smoothing == core::kNoNode || g_.node(smoothing).kind != "prim::Constant")
        throw Failure{core::nodeLabel(g_, n) + " takes its label smoothing computed at run time"};
    }
    p.vocabularyOps[n] = crossEntropy ? "tp_cross_entropy" : "tp_nll_loss";
    return true;
  }

  // A batched matmul of split operands: the split must be a batch dimension.
  Split matmul(PatternPlan& p, NodeId n, const std::vector<int>& operands, size_t outRank) {
    const Split s = joinOperands(p, n, operands, outRank);
    if (s.dim >= static_cast<int>(outRank) - 2)
      throw Failure{core::nodeLabel(g_, n) + " multiplies along the split dimension"};
    setOutputs(p, n, s);
    return s;
  }

  const Graph& g_;
  const std::vector<char>& stage_;
  int degree_;
  std::set<NodeId> pattern_;
  bool wholeParts_ = false;    // plan's `wholeParts`
  // Note [Parameters computed into an operand]: the most nodes between them.
  static constexpr size_t kMaxParameterChain = 64;
  bool unequalParts_ = false;  // a fused projection met parts of unequal sizes
  // A list of a fused projection's parts (TorchScript's split): per element, its split or whole.
  std::map<ValueId, std::vector<std::optional<Split>>> elements_;
  std::map<NodeId, ValueId> cut_;  // fused projection -> the value cut into its parts

 public:
  bool unequalParts() const { return unequalParts_; }
};

// Why the vocabulary embedding `n` cannot be split over `degree` ranks (empty: it can): its
// weight must be read by it alone (`tied`: the LM head's pattern checks the other readers), its
// rows must divide by the degree, and it must not scale gradients by frequency or make them
// sparse.
std::string vocabularyEmbeddingProblem(const Graph& graph, NodeId n, int degree, bool tied) {
  const core::Node& node = graph.node(n);
  const ValueId weight = node.inputs.at(0);
  for (NodeId c : graph.consumers(weight))
    if (c != n && !tied) return "its weight is also read by " + core::nodeLabel(graph, c);
  const core::Type& type = graph.value(weight).type;
  if (!type.shapeKnown() || type.shape().empty() || type.shape()[0] % degree != 0)
    return "its rows do not divide by " + std::to_string(degree);
  for (size_t i = 3; i < node.inputs.size(); ++i) {  // scale_grad_by_freq, sparse
    const std::optional<int64_t> flag = constantInt(graph, node.inputs[i]);
    if (!flag.has_value() || *flag != 0) return "it scales gradients by frequency or is sparse";
  }
  if (node.inputs.size() > 2 && !constantInt(graph, node.inputs[2]).has_value())
    return "its padding index is not a constant";
  return "";
}

// The column linears of an attention pattern narrower than its widest (K and V of fewer heads
// than Q: Note [Whole K/V heads]); empty for other patterns, or where every column is as wide.
std::set<NodeId> narrowColumns(const Graph& graph, const ShardPattern& pattern) {
  std::map<NodeId, int64_t> width;
  if (!pattern.attention) return {};
  for (NodeId n : pattern.nodes) {
    if (n == pattern.rowLinear || !isLinearNode(graph, n)) continue;
    const core::Type& t = graph.value(graph.node(n).outputs.at(0)).type;
    if (!t.isTensor() || !t.shapeKnown() || t.shape().empty()) return {};
    width[n] = t.shape().back();
  }
  int64_t widest = 0;
  for (const auto& [n, w] : width) widest = std::max(widest, w);
  std::set<NodeId> narrow;
  for (const auto& [n, w] : width)
    if (w < widest) narrow.insert(n);
  return narrow;
}

// Plans `pattern`, whose nodes `stage` holds all of, for `degree` ranks into `plan`; returns ""
// or the line saying why it stays replicated.
std::string planPattern(const Graph& graph, const ShardPattern& pattern,
                        const std::vector<char>& stage, int degree, PatternPlan& plan) {
  if (pattern.vocabulary == ShardPattern::Vocabulary::Embedding) {
    const NodeId n = pattern.nodes.front();
    const std::string why = vocabularyEmbeddingProblem(graph, n, degree, false);
    if (!why.empty())
      return "the vocabulary embedding at " + core::nodeLabel(graph, n) + " stays replicated: " + why;
    plan.embedding = n;
    plan.nodes = pattern.nodes;
    const ValueId weight = graph.node(n).inputs.at(0);
    plan.params[weight] = ParamShard{weight, 0, {}};
    return "";
  }
  const std::string name =
      pattern.vocabulary == ShardPattern::Vocabulary::Head
          ? "the vocabulary head at " + core::nodeLabel(graph, pattern.head)
          : std::string(pattern.attention ? "attention" : "MLP") + " ending at " +
                core::nodeLabel(graph, pattern.rowLinear);
  if (pattern.tiedEmbedding != core::kNoNode) {  // the table's rows split for both ends
    const std::string why = vocabularyEmbeddingProblem(graph, pattern.tiedEmbedding, degree, true);
    if (!why.empty())
      return name + " and its tied embedding at " + core::nodeLabel(graph, pattern.tiedEmbedding) +
             " stay replicated: the embedding: " + why;
  }
  try {
    Planner planner(graph, stage, degree);
    try {
      plan = planner.plan(pattern);
    } catch (const Failure& f) {
      // Note [Whole K/V heads], Note [Fused parts]: K and V kept whole, as columns or parts.
      const std::set<NodeId> whole = narrowColumns(graph, pattern);
      const bool parts = pattern.attention && planner.unequalParts();
      if (whole.empty() && !parts) throw;
      try {
        plan = planner.plan(pattern, whole, parts);
      } catch (const Failure& again) {
        std::string names;
        for (NodeId n : whole) names += (names.empty() ? "" : ", ") + core::nodeLabel(graph, n);
        if (parts) names += std::string(names.empty() ? "" : " and ") + "the narrower parts";
        throw Failure{f.reason + "; with " + names + " whole: " + again.reason};
      }
    }
  } catch (const Failure& f) {
    return name + " stays replicated: " + f.reason;
  } catch (const std::out_of_range&) {  // an operator with fewer operands than its schema
    return name + " stays replicated: an operator has unexpected operands";
  }
  plan.nodes = pattern.nodes;
  plan.embedding = pattern.tiedEmbedding;
  return "";
}

// Which end of a tied table's pattern a stage holding part of it splits alone: the head (every
// node of the pattern but the embedding), or the embedding where no other reader of the table
// is in the stage (a head there, not whole, reads it whole).
enum class End { None, Head, Embedding };
End tiedEnd(const Graph& graph, const ShardPattern& pattern, const std::vector<char>& stage) {
  const NodeId embedding = pattern.tiedEmbedding;
  if (stage[embedding] != 0) {
    for (NodeId c : graph.consumers(graph.node(embedding).inputs.at(0)))
      if (c != embedding && stage[c] != 0) return End::None;
    return End::Embedding;
  }
  for (NodeId n : pattern.nodes)
    if (n != embedding && stage[n] == 0) return End::None;
  return End::Head;
}

// Plans the end `end` of the tied pattern `pattern` a stage holds alone (Note [Tied tables
// across stages]); returns "" or why it stays replicated.
std::string planTiedEnd(const Graph& graph, const ShardPattern& pattern,
                        const std::vector<char>& stage, int degree, End end, PatternPlan& plan) {
  const NodeId embedding = pattern.tiedEmbedding;
  const ValueId table = graph.node(embedding).inputs.at(0);
  const std::string name = end == End::Head
                               ? "the vocabulary head at " + core::nodeLabel(graph, pattern.head)
                               : "the vocabulary embedding at " + core::nodeLabel(graph, embedding);
  // The table's gradient is summed over both ends row by row: a sparse or frequency-scaled one
  // is not (nor is a table whose rows do not divide).
  const std::string why = vocabularyEmbeddingProblem(graph, embedding, degree, true);
  if (!why.empty())
    return name + " (of a table tied to another stage) stays replicated: the embedding: " + why;
  if (end == End::Embedding) {
    plan.embedding = embedding;
    plan.nodes = {embedding};
    plan.params[table] = ParamShard{table, 0, {}};
    return "";
  }
  try {
    plan = Planner(graph, stage, degree).plan(pattern);  // the embedding counts as a reader
  } catch (const Failure& f) {
    return name + " stays replicated: " + f.reason;
  } catch (const std::out_of_range&) {
    return name + " stays replicated: an operator has unexpected operands";
  }
  for (NodeId n : pattern.nodes)
    if (n != embedding) plan.nodes.push_back(n);
  return "";
}

}  // namespace

std::vector<PatternPlan> planPatterns(const Graph& graph, const std::vector<NodeId>& nodes,
                                      int degree, std::vector<std::string>& skipped) {
  AUTOSTAGE_CHECK_AS(ConfigError, degree >= 1, "tensor-parallel degree ", degree, " is not positive");
  std::vector<PatternPlan> plans;
  if (degree == 1) return plans;
  std::vector<char> stage(graph.nodeCount(), 0);
  for (NodeId n : nodes) stage[n] = 1;
  for (const ShardPattern& pattern : findShardPatterns(graph)) {
    const bool inside = std::all_of(pattern.nodes.begin(), pattern.nodes.end(),
                                    [&](NodeId n) { return stage[n] != 0; });
    PatternPlan plan;
    std::string why;
    if (inside) {
      why = planPattern(graph, pattern, stage, degree, plan);
    } else if (pattern.tiedEmbedding == core::kNoNode) {
      continue;
    } else {  // Note [Tied tables across stages]: one end of a tied table
      const End end = tiedEnd(graph, pattern, stage);
      if (end == End::None) continue;
      why = planTiedEnd(graph, pattern, stage, degree, end, plan);
    }
    if (why.empty()) plans.push_back(std::move(plan));
    else skipped.push_back(why);
  }
  return plans;
}

SplitDegrees splitDegrees(const Graph& graph, const std::vector<ShardPattern>& patterns) {
  const std::vector<char> all(graph.nodeCount(), 1);
  SplitDegrees result;
  result.degrees.assign(patterns.size(), 0);
  result.partial.resize(patterns.size());
  result.wholeNodes.resize(patterns.size());
  result.wholeShare.resize(patterns.size());
  for (size_t i = 0; i < patterns.size(); ++i) {
    for (int degree : {2, 4, 8}) {
      PatternPlan plan;
      const std::string why = planPattern(graph, patterns[i], all, degree, plan);
      if (why.empty()) {
        result.degrees[i] |= 1u << degree;
        result.partial[i].insert(plan.partial.begin(), plan.partial.end());
        std::set<NodeId> whole = plan.wholeColumns;
        for (ValueId v : plan.whole) whole.insert(graph.producer(v));
        if (!whole.empty()) result.wholeNodes[i][degree] = std::move(whole);
        for (const auto& [param, shard] : plan.params) {
          double held = 0, extent = 0;
          for (const ShardPart& part : shard.parts) {
            extent += static_cast<double>(part.size);
            if (part.whole) held += static_cast<double>(part.size);
          }
          if (held > 0) {
            double& share = result.wholeShare[i][param];
            share = std::max(share, held / extent);
          }
        }
      } else {
        result.replicated[degree].push_back(why);
      }
    }
  }
  return result;
}

}  // namespace autostage::decomposer
