#include "frontend/torchscript/exporter.h"

#include <torch/csrc/jit/ir/constants.h>

#include <algorithm>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "frontend/torchscript/attribute_convert.h"
#include "frontend/torchscript/node_body.h"
#include "frontend/torchscript/type_convert.h"

namespace autostage::torchscript {
namespace {

using torch::jit::Value;

std::string describeSubset(const std::vector<core::NodeId>& nodes) {
  std::ostringstream out;
  out << nodes.size() << " nodes {";
  for (size_t i = 0; i < nodes.size() && i < 12; ++i) out << (i ? ", " : "") << nodes[i];
  out << (nodes.size() > 12 ? ", ...}" : "}");
  return out.str();
}

void checkSubset(const core::Graph& graph, const std::vector<core::NodeId>& sorted) {
  AUTOSTAGE_CHECK_AS(PlanError, !sorted.empty(), "cannot export an empty node subset of graph '",
                     graph.name(), "'; pass at least one node id");
  for (size_t i = 0; i < sorted.size(); ++i) {
    AUTOSTAGE_CHECK_AS(PlanError, sorted[i] >= 0 && size_t(sorted[i]) < graph.nodeCount(),
                       "node id ", sorted[i], " is out of range: graph '", graph.name(), "' has ",
                       graph.nodeCount(), " nodes");
    AUTOSTAGE_CHECK_AS(PlanError, i == 0 || sorted[i] != sorted[i - 1], "node id ", sorted[i],
                       " appears twice in the subset to export");
  }
  AUTOSTAGE_CHECK_AS(PlanError, graph.isConvex(sorted), "cannot export the non-convex subset ",
                     describeSubset(sorted), " of graph '", graph.name(),
                     "': a path leaves it and re-enters it; add the nodes on that path");
}

class TorchGraphBuilder {
 public:
  explicit TorchGraphBuilder(const core::Graph& graph)
      : graph_(graph), out_(std::make_shared<torch::jit::Graph>()) {}

  void addInput(core::ValueId id) {
    const core::Value& v = graph_.value(id);
    Value* in = out_->addInput(debugName(v.name))->setType(typeToTorch(v.type));
    env_[id] = in;
  }

  void addNode(const core::Node& node) {
    std::vector<Value*> inputs;
    for (core::ValueId v : node.inputs) inputs.push_back(env_.at(v));
    torch::jit::Node* created = nullptr;
    if (!node.body.empty()) {
      created = insertNodeFromBody(node.body, *out_, inputs);
    } else if (node.kind == "prim::Constant") {
      const core::Type& type = graph_.value(node.outputs.at(0)).type;
      std::string where = "node " + std::to_string(node.id) + " (" + node.kind + ")";
      created = out_->insertConstant(constantValue(node, type, where))->node();
    } else {
      created = out_->create(c10::Symbol::fromQualString(node.kind), inputs, node.outputs.size());
      attributesToTorch(node.attributes, created);
      for (size_t i = 0; i < node.outputs.size(); ++i)
        created->output(i)->setType(typeToTorch(graph_.value(node.outputs[i]).type));
      out_->insertNode(created);
    }
    AUTOSTAGE_INTERNAL_ASSERT(created->outputs().size() == node.outputs.size(), "node ", node.id,
                              " (", node.kind, ") was rebuilt with ", created->outputs().size(),
                              " outputs instead of ", node.outputs.size());
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      created->output(i)->setDebugName(debugName(graph_.value(node.outputs[i]).name));
      env_[node.outputs[i]] = created->output(i);
    }
  }

  void addOutput(core::ValueId id) { out_->registerOutput(env_.at(id)); }
  std::shared_ptr<torch::jit::Graph> graph() const { return out_; }

 private:
  // TorchScript debug names must not look like plain numbers.
  static std::string debugName(const std::string& name) {
    bool numeric = !name.empty() && std::all_of(name.begin(), name.end(), ::isdigit);
    return numeric ? "v" + name : name;
  }

  const core::Graph& graph_;
  std::shared_ptr<torch::jit::Graph> out_;
  std::unordered_map<core::ValueId, Value*> env_;
};

// GraphFunction accepts graphs with exactly one output: pack 0 or 2+ outputs into a tuple.
bool packOutputs(torch::jit::Graph& graph) {
  if (graph.outputs().size() == 1) return false;
  std::vector<Value*> values(graph.outputs().begin(), graph.outputs().end());
  torch::jit::Node* tuple = graph.insertNode(graph.createTuple(values));
  while (!graph.outputs().empty()) graph.eraseOutput(0);
  graph.registerOutput(tuple->output());
  return true;
}

}  // namespace

ExportedFunction::ExportedFunction(std::shared_ptr<torch::jit::Graph> graph,
                                   std::vector<core::ValueId> inputs,
                                   std::vector<core::ValueId> outputs)
    : graph_(std::move(graph)),
      packed_(packOutputs(*graph_)),
      function_(std::make_shared<torch::jit::GraphFunction>("autostage_subgraph", graph_, nullptr,
                                                            torch::jit::SIMPLE)),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)) {}

ExportedFunction::ExportedFunction(std::shared_ptr<const exportfe::Program> program,
                                   std::vector<core::ValueId> inputs,
                                   std::vector<core::ValueId> outputs)
    : packed_(false),
      program_(std::move(program)),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)) {}

ExportedFunction ExportedFunction::rebind(std::vector<core::ValueId> inputs,
                                          std::vector<core::ValueId> outputs) const {
  AUTOSTAGE_INTERNAL_ASSERT(inputs.size() == inputs_.size() && outputs.size() == outputs_.size(),
                            "rebind: ", inputs.size(), " inputs and ", outputs.size(),
                            " outputs for a function of ", inputs_.size(), " and ",
                            outputs_.size());
  ExportedFunction copy = *this;
  copy.inputs_ = std::move(inputs);
  copy.outputs_ = std::move(outputs);
  return copy;
}

std::vector<c10::IValue> ExportedFunction::run(std::vector<c10::IValue> inputs) const {
  AUTOSTAGE_CHECK(inputs.size() == inputs_.size(), "exported subgraph takes ", inputs_.size(),
                  " inputs (its boundary values), but ", inputs.size(), " were given");
  if (program_) return program_->run(std::move(inputs));
  torch::jit::Stack stack = std::move(inputs);
  function_->run(stack);
  if (packed_) {
    AUTOSTAGE_INTERNAL_ASSERT(stack.size() == 1 && stack[0].isTuple(), "packed outputs missing");
    std::vector<c10::IValue> elements = stack[0].toTupleRef().elements().vec();
    stack = std::move(elements);
  }
  AUTOSTAGE_INTERNAL_ASSERT(stack.size() == outputs_.size(), "exported subgraph returned ",
                            stack.size(), " values, expected ", outputs_.size());
  return stack;
}

ExportedFunction exportSubgraph(const core::Graph& graph, std::vector<core::NodeId> nodes) {
  std::sort(nodes.begin(), nodes.end());
  checkSubset(graph, nodes);
  core::Boundary boundary = graph.boundary(nodes);
  if (exportfe::isExportGraph(graph))
    return ExportedFunction(
        std::make_shared<const exportfe::Program>(graph, nodes, boundary.inputs, boundary.outputs),
        boundary.inputs, boundary.outputs);
  TorchGraphBuilder builder(graph);
  for (core::ValueId v : boundary.inputs) builder.addInput(v);
  for (core::NodeId id : nodes) builder.addNode(graph.node(id));
  for (core::ValueId v : boundary.outputs) builder.addOutput(v);
  return ExportedFunction(builder.graph(), boundary.inputs, boundary.outputs);
}

}  // namespace autostage::torchscript
