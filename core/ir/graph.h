#pragma once
// The IR graph: values and nodes in topological order.
//
// Invariants (checked by verify()):
//  - all graph inputs are added before the first node; value ids are dense: inputs first, then
//    node outputs in node order (so the text form round-trips ids exactly);
//  - every node input is a graph input or an output of an earlier node (topological order);
//  - value.uses lists exactly the (node, index) pairs that read it, in node order;
//  - value names are unique.
// The graph knows nothing of torch; frontend/torchscript converts to and from TorchScript.

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/ir/node.h"
#include "core/ir/type.h"
#include "core/ir/value.h"

namespace autostage::core {

// Values that enter and leave a node subset (see Graph::boundary).
struct Boundary {
  std::vector<ValueId> inputs;   // used inside, produced outside (or graph inputs); first-use order
  std::vector<ValueId> outputs;  // produced inside, used outside or returned by the graph
};

class Graph {
 public:
  explicit Graph(std::string name = "graph") : name_(std::move(name)) {}

  // Building. Names are made unique by appending `.N`; an empty name becomes the id.
  ValueId addInput(const std::string& name, Type type, ValueClass cls);
  NodeId addNode(const std::string& kind, const std::vector<ValueId>& inputs,
                 const std::vector<Type>& outputTypes, std::vector<Attribute> attributes = {},
                 const std::string& scope = "", const std::vector<std::string>& outputNames = {});
  void addOutput(ValueId value);
  void setBody(NodeId node, std::string body) { node_(node).body = std::move(body); }
  void setValueClass(ValueId value, ValueClass cls) { value_(value).cls = cls; }
  void setType(ValueId value, Type type) { value_(value).type = std::move(type); }

  const std::string& name() const { return name_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const Node& node(NodeId id) const;
  const Value& value(ValueId id) const;
  size_t nodeCount() const { return nodes_.size(); }
  size_t valueCount() const { return values_.size(); }

  // Producer node of a value, or kNoNode for graph inputs.
  NodeId producer(ValueId v) const { return value(v).producer; }
  // Distinct consumer nodes of a value, in node order.
  std::vector<NodeId> consumers(ValueId value) const;
  // Distinct producer nodes of a node's inputs (graph inputs excluded), in node order.
  std::vector<NodeId> predecessors(NodeId node) const;
  std::vector<NodeId> successors(NodeId node) const;
  bool isGraphOutput(ValueId value) const;
  // Class of a node = class of its first output (Const for nodes without outputs).
  ValueClass nodeClass(NodeId node) const;
  // Graph inputs of class Param, in input order.
  std::vector<ValueId> paramInputs() const;
  std::vector<ValueId> batchInputs() const;

  // A topological order computed from the edges (Kahn, smallest id first); equal to storage
  // order for a valid graph. Throws InternalError on a cycle.
  std::vector<NodeId> topologicalOrder() const;
  // True when no path leaves `nodes` and comes back into it (the subset can run as one stage).
  bool isConvex(const std::vector<NodeId>& nodes) const;
  Boundary boundary(const std::vector<NodeId>& nodes) const;

  // Throws InternalError naming the first broken invariant.
  void verify() const;
  // Re-derives value classes from graph-input classes (see ValueClass) and marks losses.
  void classifyValues();

  // Text form: `graph name(%x : Float(8, 16) BATCH, ...):` / one node per line / `return (...)`.
  std::string toString() const;
  static Graph parse(const std::string& text);  // throws FormatError with the line number
  // Stable 64-bit content hash of the text form (FNV-1a), as 16 hex digits.
  std::string hash() const;

  bool operator==(const Graph& other) const { return toString() == other.toString(); }

 private:
  Node& node_(NodeId id);
  Value& value_(ValueId id);
  std::string uniqueName(const std::string& wanted, ValueId id);

  std::string name_;
  std::vector<Node> nodes_;
  std::vector<Value> values_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
  std::unordered_set<std::string> names_;
};

// 64-bit FNV-1a over bytes, as 16 lowercase hex digits.
std::string fnv1aHex(const std::string& bytes);

// Readable node name for logs and errors: `node 12 aten::linear (fc1) -> out_name`.
std::string nodeLabel(const Graph& graph, NodeId node);

}  // namespace autostage::core
