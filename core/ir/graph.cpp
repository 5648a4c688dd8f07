#include "core/ir/graph.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <queue>
#include <sstream>

#include "core/error.h"

namespace autostage::core {

std::string valueClassName(ValueClass cls) {
  switch (cls) {
    case ValueClass::Batch: return "BATCH";
    case ValueClass::Param: return "PARAM";
    case ValueClass::Const: return "CONST";
    case ValueClass::Loss: return "LOSS";
  }
  return "CONST";
}

ValueClass valueClassFromName(const std::string& name) {
  for (ValueClass c : {ValueClass::Batch, ValueClass::Param, ValueClass::Const, ValueClass::Loss})
    if (valueClassName(c) == name) return c;
  throw FormatError("unknown value class '" + name + "'; expected BATCH, PARAM, CONST or LOSS");
}

const Attribute* Node::findAttribute(const std::string& attrName) const {
  for (const auto& a : attributes)
    if (a.name == attrName) return &a;
  return nullptr;
}

std::string fnv1aHex(const std::string& bytes) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string Graph::uniqueName(const std::string& wanted, ValueId id) {
  std::string base;
  for (char c : wanted) base += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.') ? c : '_';
  if (base.empty()) base = std::to_string(id);
  std::string name = base;
  for (int suffix = 1; names_.count(name); ++suffix) name = base + "." + std::to_string(suffix);
  names_.insert(name);
  return name;
}

ValueId Graph::addInput(const std::string& name, Type type, ValueClass cls) {
  AUTOSTAGE_CHECK_AS(InternalError, nodes_.empty(),
                     "graph inputs must be added before nodes (input '", name, "')");
  Value v;
  v.id = static_cast<ValueId>(values_.size());
  v.name = uniqueName(name, v.id);
  v.type = std::move(type);
  v.cls = cls;
  v.outputIndex = static_cast<int>(inputs_.size());
  values_.push_back(std::move(v));
  inputs_.push_back(values_.back().id);
  return values_.back().id;
}

NodeId Graph::addNode(const std::string& kind, const std::vector<ValueId>& inputs,
                      const std::vector<Type>& outputTypes, std::vector<Attribute> attributes,
                      const std::string& scope, const std::vector<std::string>& outputNames) {
  Node n;
  n.id = static_cast<NodeId>(nodes_.size());
  n.kind = kind;
  n.inputs = inputs;
  n.attributes = std::move(attributes);
  n.scope = scope;
  for (size_t i = 0; i < inputs.size(); ++i) {
    AUTOSTAGE_CHECK_AS(InternalError, inputs[i] >= 0 && inputs[i] < ValueId(values_.size()),
                       "node ", n.id, " (", kind, ") input ", i, " refers to unknown value ",
                       inputs[i]);
    values_[inputs[i]].uses.push_back({n.id, static_cast<int>(i)});
  }
  for (size_t i = 0; i < outputTypes.size(); ++i) {
    Value v;
    v.id = static_cast<ValueId>(values_.size());
    v.name = uniqueName(i < outputNames.size() ? outputNames[i] : "", v.id);
    v.type = outputTypes[i];
    v.producer = n.id;
    v.outputIndex = static_cast<int>(i);
    n.outputs.push_back(v.id);
    values_.push_back(std::move(v));
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().id;
}

void Graph::addOutput(ValueId v) {
  value(v);  // range check
  outputs_.push_back(v);
}

const Node& Graph::node(NodeId id) const {
  AUTOSTAGE_CHECK_AS(InternalError, id >= 0 && id < NodeId(nodes_.size()), "no node with id ", id,
                     " (graph has ", nodes_.size(), " nodes)");
  return nodes_[id];
}

const Value& Graph::value(ValueId id) const {
  AUTOSTAGE_CHECK_AS(InternalError, id >= 0 && id < ValueId(values_.size()), "no value with id ",
                     id, " (graph has ", values_.size(), " values)");
  return values_[id];
}

Node& Graph::node_(NodeId id) { return const_cast<Node&>(node(id)); }
Value& Graph::value_(ValueId id) { return const_cast<Value&>(value(id)); }

std::vector<NodeId> Graph::consumers(ValueId v) const {
  std::vector<NodeId> result;
  for (const Use& u : value(v).uses)
    if (result.empty() || result.back() != u.node) result.push_back(u.node);
  return result;
}

std::vector<NodeId> Graph::predecessors(NodeId id) const {
  std::vector<NodeId> result;
  for (ValueId v : node(id).inputs)
    if (values_[v].producer != kNoNode) result.push_back(values_[v].producer);
  std::sort(result.begin(), result.end());
  result.erase(std::unique(result.begin(), result.end()), result.end());
  return result;
}

std::vector<NodeId> Graph::successors(NodeId id) const {
  std::vector<NodeId> result;
  for (ValueId v : node(id).outputs)
    for (const Use& u : values_[v].uses) result.push_back(u.node);
  std::sort(result.begin(), result.end());
  result.erase(std::unique(result.begin(), result.end()), result.end());
  return result;
}

bool Graph::isGraphOutput(ValueId v) const {
  return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end();
}

ValueClass Graph::nodeClass(NodeId id) const {
  const Node& n = node(id);
  return n.outputs.empty() ? ValueClass::Const : values_[n.outputs[0]].cls;
}

std::vector<ValueId> Graph::paramInputs() const {
  std::vector<ValueId> result;
  for (ValueId v : inputs_)
    if (values_[v].cls == ValueClass::Param) result.push_back(v);
  return result;
}

std::vector<ValueId> Graph::batchInputs() const {
  std::vector<ValueId> result;
  for (ValueId v : inputs_)
    if (values_[v].cls == ValueClass::Batch) result.push_back(v);
  return result;
}

std::vector<NodeId> Graph::topologicalOrder() const {
  std::vector<int> pending(nodes_.size());
  for (const Node& n : nodes_) pending[n.id] = static_cast<int>(predecessors(n.id).size());
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<>> ready;
  for (const Node& n : nodes_)
    if (pending[n.id] == 0) ready.push(n.id);
  std::vector<NodeId> order;
  while (!ready.empty()) {
    NodeId id = ready.top();
    ready.pop();
    order.push_back(id);
    for (NodeId s : successors(id))
      if (--pending[s] == 0) ready.push(s);
  }
  AUTOSTAGE_CHECK_AS(InternalError, order.size() == nodes_.size(), "graph '", name_,
                     "' has a cycle: only ", order.size(), " of ", nodes_.size(),
                     " nodes could be ordered");
  return order;
}

// A subset S is convex iff no node outside S lies on a path between two nodes of S. Nodes are in
// topological order, so such a node has an id between min(S) and max(S): sweep that range once,
// marking nodes reachable from S; S is not convex iff a node of S reads a marked outside node.
bool Graph::isConvex(const std::vector<NodeId>& subset) const {
  if (subset.empty()) return true;
  auto [lo, hi] = std::minmax_element(subset.begin(), subset.end());
  std::vector<char> inSet(nodes_.size(), 0), reached(nodes_.size(), 0);
  for (NodeId id : subset) inSet[node(id).id] = 1;
  for (NodeId id = *lo; id <= *hi; ++id) {
    for (NodeId p : predecessors(id)) {
      if (p < *lo) continue;
      if (inSet[id] && !inSet[p] && reached[p]) return false;
      if (inSet[p] || reached[p]) reached[id] = 1;
    }
  }
  return true;
}

Boundary Graph::boundary(const std::vector<NodeId>& subset) const {
  std::vector<char> inSet(nodes_.size(), 0), seen(values_.size(), 0);
  std::vector<NodeId> sorted = subset;
  std::sort(sorted.begin(), sorted.end());
  for (NodeId id : sorted) inSet[node(id).id] = 1;
  Boundary b;
  for (NodeId id : sorted) {
    for (ValueId v : nodes_[id].inputs) {
      NodeId p = values_[v].producer;
      if ((p == kNoNode || !inSet[p]) && !seen[v]) seen[v] = 1, b.inputs.push_back(v);
    }
  }
  for (NodeId id : sorted) {
    for (ValueId v : nodes_[id].outputs) {
      bool usedOutside = isGraphOutput(v);
      for (const Use& u : values_[v].uses) usedOutside = usedOutside || !inSet[u.node];
      if (usedOutside) b.outputs.push_back(v);
    }
  }
  return b;
}

void Graph::verify() const {
  std::unordered_set<std::string> seenNames;
  std::vector<std::vector<Use>> uses(values_.size());
  for (size_t i = 0; i < inputs_.size(); ++i)
    AUTOSTAGE_CHECK_AS(InternalError, inputs_[i] == ValueId(i) && values_[i].producer == kNoNode,
                       "graph '", name_, "': input ", i, " is not value ", i);
  ValueId next = static_cast<ValueId>(inputs_.size());
  for (const Node& n : nodes_) {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      ValueId v = n.inputs[i];
      AUTOSTAGE_CHECK_AS(InternalError, v >= 0 && v < next, "graph '", name_, "': node ", n.id,
                         " (", n.kind, ") reads value ", v, " before it is produced");
      uses[v].push_back({n.id, static_cast<int>(i)});
    }
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      AUTOSTAGE_CHECK_AS(InternalError, n.outputs[i] == next, "graph '", name_, "': node ",
                         n.id, " output ", i, " has id ", n.outputs[i], ", expected ", next);
      const Value& v = values_[next++];
      AUTOSTAGE_CHECK_AS(InternalError, v.producer == n.id && v.outputIndex == int(i), "graph '",
                         name_, "': value ", v.name, " has the wrong producer");
    }
  }
  AUTOSTAGE_CHECK_AS(InternalError, next == ValueId(values_.size()), "graph '", name_,
                     "': ", values_.size() - next, " values belong to no node");
  for (const Value& v : values_) {
    AUTOSTAGE_CHECK_AS(InternalError, seenNames.insert(v.name).second, "graph '", name_,
                       "': duplicate value name '", v.name, "'");
    AUTOSTAGE_CHECK_AS(InternalError, v.uses == uses[v.id], "graph '", name_, "': use list of '",
                       v.name, "' is stale");
  }
  for (ValueId v : outputs_)
    AUTOSTAGE_CHECK_AS(InternalError, v >= 0 && v < next, "graph '", name_,
                       "': output refers to unknown value ", v);
}

void Graph::classifyValues() {
  for (Node& n : nodes_) {
    ValueClass cls = ValueClass::Const;
    for (ValueId v : n.inputs) {
      ValueClass in = values_[v].cls;
      if (in == ValueClass::Batch || in == ValueClass::Loss) cls = ValueClass::Batch;
      else if (in == ValueClass::Param && cls == ValueClass::Const) cls = ValueClass::Param;
    }
    for (ValueId v : n.outputs) values_[v].cls = cls;
  }
  for (ValueId v : outputs_) {
    Value& val = values_[v];
    const Type& t = val.type;
    if (val.cls == ValueClass::Batch && t.isTensor() && t.shapeKnown() && t.shape().empty() &&
        isFloatingPoint(t.dtype()))
      val.cls = ValueClass::Loss;
  }
}

std::string Graph::hash() const { return fnv1aHex(toString()); }

std::string nodeLabel(const Graph& graph, NodeId node) {
  const Node& n = graph.node(node);
  std::ostringstream out;
  out << "node " << node << " " << n.kind;
  if (!n.scope.empty()) out << " (" << n.scope << ")";
  if (!n.outputs.empty()) out << " -> " << graph.value(n.outputs[0]).name;
  return out.str();
}

}  // namespace autostage::core
