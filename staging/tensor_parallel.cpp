// Rewriting a stage for one member of a tensor-parallel group; Note [Tensor-parallel stages].
#include "staging/tensor_parallel.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "core/error.h"
#include "decomposer/tensor_parallel_patterns.h"
#include "decomposer/tensor_parallel_split.h"
#include "frontend/export/interpreter.h"

namespace autostage::staging {
namespace {

using core::Graph;
using core::NodeId;
using core::ValueId;
using decomposer::baseKind;
using decomposer::constantInt;
using decomposer::isKind;
using decomposer::isNone;
using decomposer::PatternPlan;
using decomposer::planPatterns;
using decomposer::Rewrite;

// `type` with dimension `dim` the member's `extent` (shapes the front ends record).
core::Type memberType(const core::Type& type, int dim, int64_t extent) {
  if (!type.isTensor() || !type.shapeKnown()) return type;
  std::vector<int64_t> shape = type.shape();
  if (dim < static_cast<int>(shape.size())) shape[dim] = extent;
  return core::Type::tensor(type.dtype(), shape, type.requiresGrad());
}

// `type` with dimension `dim` divided by `degree` (an unknown extent stays unknown).
core::Type dividedType(const core::Type& type, int dim, int degree) {
  if (!type.isTensor() || !type.shapeKnown() || dim >= static_cast<int>(type.shape().size()) ||
      type.shape()[dim] <= 0)
    return type;
  return memberType(type, dim, type.shape()[dim] / degree);
}

// The type tp_slice gives whole value `type` sliced as `split`: each block of split.size indices
// along split.dim to size / degree of them, or to one where the members outnumber them (Note
// [Grouped sdpa] in decomposer/tensor_parallel_split.cpp).
core::Type slicedType(const core::Type& type, const decomposer::Split& split, int degree) {
  if (!type.isTensor() || !type.shapeKnown() || split.dim >= static_cast<int>(type.shape().size()))
    return type;
  const int64_t extent = type.shape()[split.dim];
  if (split.size <= 0 || extent <= 0 || extent % split.size != 0) return type;
  return memberType(type, split.dim,
                    extent / split.size * std::max<int64_t>(split.size / degree, 1));
}

// A member's type of value `v` split as `s` by `plan`: a fused projection's output before its
// cut holds the member's parts (Note [Fused parts]); any other split value 1/degree.
core::Type splitType(const Graph& graph, const PatternPlan& plan, ValueId v,
                     const decomposer::Split& s, int degree) {
  const core::Type& type = graph.value(v).type;
  auto parts = plan.parts.find(s.origin);
  if (parts != plan.parts.end() && type.isTensor() && type.shapeKnown()) {
    const std::vector<int64_t>& width =
        graph.value(graph.node(s.origin).outputs.at(0)).type.shape();
    if (s.size == width.back() && s.dim < static_cast<int>(type.shape().size()) &&
        type.shape()[s.dim] == s.size)
      return memberType(type, s.dim, decomposer::memberExtent(parts->second, degree));
  }
  return dividedType(type, s.dim, degree);
}

// Builds the member's stage graph: the stage's nodes in order, with each plan's rewrites.
class Builder {
 public:
  // `dropouts`: rewrite every dropout to tp_dropout (a group of more than one rank).
  Builder(const Graph& g, bool exportKinds, int degree, int64_t group, bool dropouts)
      : g_(g),
        exportKinds_(exportKinds),
        dropouts_(dropouts),
        degree_(degree),
        group_(group),
        out_(g.name() + ".tp") {}

  ValueId input(ValueId v, const core::Type& type) {
    const core::Value& value = g_.value(v);
    const ValueId n = out_.addInput(value.name, type, value.cls);
    map_[v] = n;
    return n;
  }

  ValueId intConstant(int64_t value) {
    const NodeId c = out_.addNode("prim::Constant", {}, {core::Type::scalar(core::TypeKind::Int)},
                                  {core::Attribute{"value", value}});
    return out_.node(c).outputs.at(0);
  }

  ValueId noneConstant() {
    const NodeId c = out_.addNode("prim::Constant", {}, {core::Type::scalar(core::TypeKind::None)});
    return out_.node(c).outputs.at(0);
  }

  std::string kind(const char* name) const {
    return std::string("autostage::") + name + (exportKinds_ ? ".default" : "");
  }

  // The list input rewritten: a new list whose entries in `rewrite` are new constants.
  ValueId rewriteList(ValueId list, const Rewrite& rewrite) {
    if (rewrite.count(-1)) return intConstant(rewrite.at(-1));
    const core::Node& producer = g_.node(g_.producer(list));
    if (producer.kind == "prim::Constant") {
      std::vector<int64_t> values = std::get<std::vector<int64_t>>(producer.findAttribute("value")->value);
      for (auto [k, v] : rewrite) values[k] = v;
      const NodeId c = out_.addNode("prim::Constant", {}, {g_.value(list).type},
                                    {core::Attribute{"value", values}});
      return out_.node(c).outputs.at(0);
    }
    std::vector<ValueId> elements;
    for (size_t k = 0; k < producer.inputs.size(); ++k) {
      auto it = rewrite.find(static_cast<int>(k));
      elements.push_back(it != rewrite.end() ? intConstant(it->second) : map_.at(producer.inputs[k]));
    }
    const NodeId c = out_.addNode("prim::ListConstruct", elements, {g_.value(list).type});
    return out_.node(c).outputs.at(0);
  }

  void node(NodeId n, const PatternPlan* plan,
            const std::map<ValueId, core::Type>& splitTypes) {
    const core::Node& node = g_.node(n);
    std::vector<ValueId> inputs;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId v = node.inputs[i];
      const Rewrite* rewrite = nullptr;
      if (plan) {
        auto it = plan->rewrites.find({n, static_cast<int>(i)});
        if (it != plan->rewrites.end() && !it->second.empty()) rewrite = &it->second;
      }
      inputs.push_back(rewrite ? rewriteList(v, *rewrite) : map_.at(v));
    }
    if (plan && (plan->columns.count(n) || plan->wholeColumns.count(n))) {
      // The activation through tp_copy, once per value (Q's and a whole K's: one).
      const ValueId x = decomposer::linearActivation(g_, n);
      for (size_t i = 0; i < node.inputs.size(); ++i)
        if (node.inputs[i] == x) inputs[i] = copyOf(x);
    }
    for (size_t i = 0; plan && i < node.inputs.size(); ++i) {  // Note [Whole K/V heads]
      auto it = plan->slices.find({n, static_cast<int>(i)});
      if (it != plan->slices.end()) inputs[i] = sliceOf(inputs[i], node.inputs[i], it->second);
    }
    ValueId bias = -1;
    std::string op = node.kind;
    if (plan && plan->row == n) {  // the bias after the all-reduce
      if (decomposer::baseKind(op) == "aten::linear" && !isNone(g_, node.inputs.at(2))) {
        bias = inputs[2];
        inputs[2] = noneConstant();
      } else if (decomposer::baseKind(op) == "aten::addmm") {
        bias = inputs[0];
        inputs = {inputs[1], inputs[2]};
        op = exportKinds_ ? "aten::mm.default" : "aten::mm";
      }
    }
    std::vector<core::Type> types;
    for (ValueId v : node.outputs) {
      auto it = splitTypes.find(v);
      types.push_back(it != splitTypes.end() ? it->second : g_.value(v).type);
    }
    std::vector<std::string> names;
    for (ValueId v : node.outputs) names.push_back(g_.value(v).name);
    std::vector<core::Attribute> attributes = node.attributes;
    if (plan && plan->embedding == n) {  // this member's rows, then the all-reduce
      op = kind("tp_embedding");
      const int64_t padding = inputs.size() > 2 ? *constantInt(g_, node.inputs[2]) : -1;
      inputs = {inputs[0], inputs[1], intConstant(padding), intConstant(group_)};
      attributes.clear();
    }
    if (plan && plan->vocabularyOps.count(n)) {  // Note [Vocabulary-parallel loss]
      const std::string name = plan->vocabularyOps.at(n);
      op = kind(name.c_str());
      if (name == "tp_log_softmax") {
        const int64_t dim = *constantInt(g_, node.inputs[1]);
        const int64_t rank = static_cast<int64_t>(g_.value(node.inputs[0]).type.shape().size());
        inputs = {inputs[0], intConstant(dim < 0 ? dim + rank : dim)};
      } else if (name == "tp_nll_loss") {
        inputs = {inputs[0], inputs[1], inputs[3], inputs[4]};
      } else {
        inputs = {inputs[0], inputs[1], inputs[3], inputs[4], inputs[5]};
      }
      inputs.push_back(intConstant(group_));
      attributes.clear();
    }
    if (dropouts_ && isKind(node, {"aten::dropout"}) && inputs.size() == 3) {
      // Note [Tensor-parallel dropout]: the group's masks, the member's own where split.
      op = kind("tp_dropout");
      inputs.push_back(intConstant(splitTypes.count(node.inputs[0]) ? 1 : 0));
      inputs.push_back(intConstant(group_));
      attributes.clear();
    }
    const NodeId created = out_.addNode(op, inputs, types, attributes, node.scope, names);
    origin_.resize(out_.nodeCount(), core::kNoNode);
    origin_[created] = n;
    if (!node.body.empty()) out_.setBody(created, node.body);
    for (size_t i = 0; i < node.outputs.size(); ++i) map_[node.outputs[i]] = out_.node(created).outputs[i];
    if (plan && plan->row == n) {
      const ValueId y = out_.node(created).outputs.at(0);
      const ValueId b = bias >= 0 ? bias : noneConstant();
      const NodeId reduce = out_.addNode(kind("tp_reduce"), {y, b, intConstant(group_)},
                                         {g_.value(node.outputs.at(0)).type}, {}, node.scope);
      map_[node.outputs.at(0)] = out_.node(reduce).outputs.at(0);
    }
  }

  // The member's part of whole value `value` (standing for original `original`) along `split`.
  ValueId sliceOf(ValueId value, ValueId original, const decomposer::Split& split) {
    const NodeId c = out_.addNode(kind("tp_slice"),
                                  {value, intConstant(split.dim), intConstant(split.size),
                                   intConstant(degree_), intConstant(group_)},
                                  {slicedType(g_.value(original).type, split, degree_)}, {}, "");
    return out_.node(c).outputs.at(0);
  }

  ValueId copyOf(ValueId x) {
    auto it = copies_.find(x);
    if (it != copies_.end()) return it->second;
    const NodeId c = out_.addNode(kind("tp_copy"), {map_.at(x), intConstant(group_)},
                                  {g_.value(x).type}, {}, "");
    return copies_[x] = out_.node(c).outputs.at(0);
  }

  void output(ValueId v) { out_.addOutput(map_.at(v)); }
  Graph take() { return std::move(out_); }
  std::vector<NodeId> origin() const {
    std::vector<NodeId> o = origin_;
    o.resize(out_.nodeCount(), core::kNoNode);
    return o;
  }

 private:
  const Graph& g_;
  bool exportKinds_;
  bool dropouts_;
  int degree_;
  int64_t group_;
  Graph out_;
  std::map<ValueId, ValueId> map_;
  std::map<ValueId, ValueId> copies_;
  std::vector<NodeId> origin_;  // per node of out_ made so far (ShardedStage::origin)
};

// A random operator other than the dropout the rewrite turns into tp_dropout.
bool drawsOwnRandom(const core::Node& n) {
  return isKind(n, {"aten::rand", "aten::randn", "aten::rand_like", "aten::randn_like", "aten::randint",
                "aten::randint_like", "aten::bernoulli", "aten::bernoulli_", "aten::normal",
                "aten::normal_", "aten::uniform_", "aten::multinomial", "aten::randperm",
                "aten::dropout_", "aten::native_dropout", "aten::feature_dropout",
                "aten::feature_dropout_", "aten::alpha_dropout", "aten::feature_alpha_dropout"}) ||
         (isKind(n, {"aten::dropout"}) && n.inputs.size() != 3);
}

// The parameter slices `plans` give, ascending parameter.
std::vector<ParamShard> shardsOf(const std::vector<PatternPlan>& plans) {
  std::map<ValueId, ParamShard> shards;
  for (const PatternPlan& p : plans)
    for (const auto& [v, s] : p.params) shards[v] = s;
  std::vector<ParamShard> out;
  for (const auto& [v, s] : shards) out.push_back(s);
  return out;
}

}  // namespace

std::vector<ParamShard> shardedParameters(const Graph& graph, const std::vector<NodeId>& nodes,
                                          int degree) {
  std::vector<std::string> skipped;
  return shardsOf(planPatterns(graph, nodes, degree, skipped));
}

ShardedStage shardStage(const Graph& graph, const std::vector<NodeId>& nodes, int degree,
                        int64_t group) {
  ShardedStage result;
  const std::vector<PatternPlan> plans = planPatterns(graph, nodes, degree, result.skipped);
  std::map<NodeId, const PatternPlan*> planOf;
  for (const PatternPlan& p : plans)
    for (NodeId n : p.nodes) planOf[n] = &p;
  result.sharded = static_cast<int>(plans.size());
  for (const auto& [n, plan] : planOf) result.patternNodes.push_back(n);

  std::map<ValueId, core::Type> splitTypes;
  for (const PatternPlan& p : plans)
    for (const auto& [v, s] : p.split)
      if (graph.value(v).type.isTensor()) splitTypes[v] = splitType(graph, p, v, s, degree);
  std::map<ValueId, ParamShard> shards;
  for (const ParamShard& s : shardsOf(plans)) shards[s.param] = s;

  Builder builder(graph, exportfe::isExportGraph(graph), degree, group, degree > 1);
  const core::Boundary boundary = graph.boundary(nodes);
  for (ValueId v : boundary.inputs) {
    auto s = shards.find(v);
    const core::Type& type = graph.value(v).type;
    builder.input(
        v, s == shards.end()
               ? type
               : memberType(
                     type, s->second.dim,
                     decomposer::memberExtent(
                         decomposer::partsOf(s->second, type.shape().at(s->second.dim)), degree)));
    result.inputs.push_back(v);
  }
  for (NodeId n : nodes) {
    auto it = planOf.find(n);
    builder.node(n, it == planOf.end() ? nullptr : it->second, splitTypes);
    if (degree > 1 && drawsOwnRandom(graph.node(n))) ++result.ownRandom;
  }
  for (ValueId v : boundary.outputs) {
    builder.output(v);
    result.outputs.push_back(v);
  }
  result.origin = builder.origin();
  result.graph = builder.take();
  result.shards = shardsOf(plans);
  std::set<ValueId> partial;
  for (const PatternPlan& p : plans) partial.insert(p.partial.begin(), p.partial.end());
  result.partial.assign(partial.begin(), partial.end());
  return result;
}

}  // namespace autostage::staging
