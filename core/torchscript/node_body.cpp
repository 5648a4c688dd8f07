#include "core/torchscript/node_body.h"

#include <memory>
#include <unordered_set>

#include <torch/csrc/jit/ir/irparser.h>

#include "core/error.h"

namespace autostage::torchscript {
namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

void collectDefined(const Block* block, std::unordered_set<const Value*>& defined) {
  for (const Value* p : block->inputs()) defined.insert(p);
  for (const Node* n : block->nodes()) {
    for (const Value* o : n->outputs()) defined.insert(o);
    for (const Block* b : n->blocks()) collectDefined(b, defined);
  }
}

void collectUses(const Block* block, const std::unordered_set<const Value*>& defined,
                 std::unordered_set<const Value*>& seen, std::vector<Value*>& out) {
  auto visit = [&](const Node* n) {
    for (const Value* v : n->inputs())
      if (!defined.count(v) && seen.insert(v).second) out.push_back(const_cast<Value*>(v));
  };
  for (const Node* n : block->nodes()) {
    visit(n);
    for (const Block* b : n->blocks()) collectUses(b, defined, seen, out);
  }
  visit(block->return_node());
}

// Gives every value in the body graph a distinct generated name (see Note [Node body text]).
void nameValues(Block* block, int& counter) {
  for (Value* v : block->inputs()) v->setDebugName("v" + std::to_string(counter++));
  for (Node* n : block->nodes()) {
    for (Value* o : n->outputs()) o->setDebugName("v" + std::to_string(counter++));
    for (Block* b : n->blocks()) nameValues(b, counter);
  }
}

std::shared_ptr<torch::jit::Graph> parseBody(const std::string& text) {
  auto graph = std::make_shared<torch::jit::Graph>();
  torch::jit::parseIR(text, graph.get(), /*parse_tensor_constants=*/false);
  return graph;
}

}  // namespace

std::vector<Value*> capturedValues(const Node* node) {
  std::unordered_set<const Value*> defined, seen;
  std::vector<Value*> out;
  for (const Block* b : node->blocks()) collectDefined(b, defined);
  for (const Block* b : node->blocks()) collectUses(b, defined, seen, out);
  return out;
}

std::string nodeBodyText(Node* node, const std::vector<Value*>& inputs, const std::string& where) {
  auto graph = std::make_shared<torch::jit::Graph>();
  std::unordered_map<Value*, Value*> env;
  for (Value* v : inputs) env[v] = graph->addInput()->setType(v->type());
  Node* clone = graph->createClone(node, [&](Value* v) { return env.at(v); });
  graph->insertNode(clone);
  for (Value* o : clone->outputs()) graph->registerOutput(o);
  int counter = 0;
  nameValues(graph->block(), counter);
  // parseIR does not keep every name (e.g. outputs of nodes with blocks), so store the text as
  // parseIR reproduces it and require that this canonical text is a fixed point.
  std::string text, reparsed;
  try {
    text = parseBody(graph->toString(/*print_source_locations=*/false))->toString(false);
    reparsed = parseBody(text)->toString(false);
  } catch (const std::exception& e) {
    reparsed = std::string("<parse error: ") + e.what() + ">";
  }
  AUTOSTAGE_CHECK_AS(UnsupportedError, !text.empty() && reparsed == text, "unsupported ",
                     node->kind().toQualString(), " at ", where,
                     ": its body does not survive a TorchScript text round trip (",
                     reparsed.substr(0, 300),
                     "); avoid tensor constants and custom classes inside control flow");
  return text;
}

Node* insertNodeFromBody(const std::string& body, torch::jit::Graph& target,
                         const std::vector<Value*>& inputs) {
  auto graph = parseBody(body);
  AUTOSTAGE_CHECK_AS(FormatError, graph->inputs().size() == inputs.size(),
                     "node body has ", graph->inputs().size(), " inputs, but the IR node has ",
                     inputs.size(), "; the body text does not belong to this node");
  std::unordered_map<Value*, Value*> env;
  for (size_t i = 0; i < inputs.size(); ++i) env[graph->inputs()[i]] = inputs[i];
  Node* only = nullptr;
  for (Node* n : graph->nodes()) {
    AUTOSTAGE_CHECK_AS(FormatError, only == nullptr, "node body must contain exactly one node");
    only = n;
  }
  AUTOSTAGE_CHECK_AS(FormatError, only != nullptr, "node body contains no node");
  Node* clone = target.createClone(only, [&](Value* v) { return env.at(v); });
  return target.insertNode(clone);
}

}  // namespace autostage::torchscript
