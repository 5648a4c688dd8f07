#include "frontend/torchscript/node_body.h"

#include <torch/csrc/jit/ir/irparser.h>

#include <memory>
#include <unordered_set>

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

// Note [Placeholder outputs]: the printer writes a node without outputs as ` = prim::Loop(...)`,
// which parseIR cannot read (a loop nested in a loop, a branch that only writes into a tensor or
// only raises, prim::RaiseException itself). In the body text every such node carries one
// NoneType output: a branch returns a None constant from each block, a loop carries a None
// through its body, and any other node (its schema returns nothing, so the parser would not
// accept an output either) is written as autostage::no_outputs[kind="..."] with its inputs.
// Parsing for use undoes all three (dropPlaceholders), so the node runs as traced.
const c10::Symbol kNoOutputs = c10::Symbol::fromQualString("autostage::no_outputs");
const c10::Symbol kKindAttr = c10::Symbol::attr("kind");

bool isNoneConstant(const Value* v) {
  return v->node()->kind() == torch::jit::prim::Constant &&
         v->type()->kind() == c10::TypeKind::NoneType;
}

// `replacement` takes `n`'s inputs and place; `n` is destroyed.
void replaceNode(Node* n, Node* replacement) {
  for (Value* v : n->inputs()) replacement->addInput(v);
  replacement->insertBefore(n);
  n->destroy();
}

void addPlaceholders(torch::jit::Graph& graph, Block* block) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* n = *it++;
    for (Block* b : n->blocks()) addPlaceholders(graph, b);
    if (!n->outputs().empty()) continue;
    if (n->kind() == torch::jit::prim::If) {
      for (Block* b : n->blocks()) {
        torch::jit::WithInsertPoint point(b->return_node());
        b->registerOutput(graph.insertConstant(c10::IValue()));
      }
    } else if (n->kind() == torch::jit::prim::Loop) {
      torch::jit::WithInsertPoint point(n);
      n->addInput(graph.insertConstant(c10::IValue()));
      Block* body = n->blocks()[0];
      body->registerOutput(body->addInput()->setType(c10::NoneType::get()));
    } else {
      AUTOSTAGE_CHECK_AS(UnsupportedError, n->blocks().empty() && n->attributeNames().empty(),
                         "unsupported ", n->kind().toQualString(),
                         " without outputs inside control flow (it has attributes or blocks)");
      Node* standIn = graph.create(kNoOutputs, 1);
      standIn->s_(kKindAttr, n->kind().toQualString());
      standIn->output()->setType(c10::NoneType::get());
      replaceNode(n, standIn);
      continue;
    }
    n->addOutput()->setType(c10::NoneType::get());
  }
}

void dropPlaceholders(Block* block) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* n = *it++;
    for (Block* b : n->blocks()) dropPlaceholders(b);
    if (n->outputs().size() != 1 || n->output()->type()->kind() != c10::TypeKind::NoneType ||
        n->output()->hasUses())
      continue;
    if (n->kind() == kNoOutputs) {
      replaceNode(n, block->owningGraph()->create(
                         c10::Symbol::fromQualString(n->s(kKindAttr)), 0));
      continue;
    }
    if (n->kind() == torch::jit::prim::If) {
      bool ours = true;
      for (Block* b : n->blocks())
        ours = ours && b->outputs().size() == 1 && isNoneConstant(b->outputs()[0]);
      if (!ours) continue;
      for (Block* b : n->blocks()) {
        Node* constant = b->outputs()[0]->node();
        b->eraseOutput(0);
        if (!constant->output()->hasUses()) constant->destroy();
      }
    } else if (n->kind() == torch::jit::prim::Loop) {
      Block* body = n->blocks()[0];
      // inputs: trip count, condition, the carried None; body: iteration, the None -> it.
      if (n->inputs().size() != 3 || !isNoneConstant(n->inputs()[2]) ||
          body->inputs().size() != 2 || body->outputs().size() != 2 ||
          body->outputs()[1] != body->inputs()[1] || body->inputs()[1]->uses().size() != 1)
        continue;
      body->eraseOutput(1);
      body->eraseInput(1);
      Node* constant = n->inputs()[2]->node();
      n->removeInput(2);
      if (!constant->output()->hasUses()) constant->destroy();
    } else {
      continue;
    }
    n->eraseOutput(0);
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
  addPlaceholders(*graph, graph->block());  // Note [Placeholder outputs]
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
  dropPlaceholders(graph->block());  // Note [Placeholder outputs]
  AUTOSTAGE_CHECK_AS(FormatError, graph->inputs().size() == inputs.size(), "node body has ",
                     graph->inputs().size(), " inputs, but the IR node has ", inputs.size(),
                     "; the body text does not belong to this node");
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
