#include "frontend/torchscript/importer.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/lower_graph.h>
#include <torch/csrc/jit/passes/remove_mutation.h>

#include <functional>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "frontend/torchscript/attribute_convert.h"
#include "frontend/torchscript/autocast.h"
#include "frontend/torchscript/node_body.h"
#include "frontend/torchscript/type_convert.h"

namespace autostage::torchscript {
namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;
using ValueMap = std::unordered_map<const Value*, c10::IValue>;

// True for a tensor or (nested) tuple/list of tensors; checks each tensor's dtype.
bool isTensorIValue(const c10::IValue& v, const std::string& where) {
  if (v.isTensor()) {
    if (v.toTensor().defined()) dtypeFromTorch(v.toTensor().scalar_type(), where);
    return true;
  }
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements())
      if (!isTensorIValue(e, where)) return false;
    return true;
  }
  if (v.isList()) {
    for (const auto& e : v.toListRef())
      if (!isTensorIValue(e, where)) return false;
    return true;
  }
  return false;
}

// Checks forward's arguments against the example inputs; returns the argument names.
std::vector<std::string> checkForwardArguments(const c10::FunctionSchema& schema,
                                               const std::vector<c10::IValue>& inputs) {
  std::vector<std::string> names;
  const auto& args = schema.arguments();
  for (size_t i = 1; i < args.size(); ++i) {
    AUTOSTAGE_CHECK_AS(UnsupportedError, !args[i].kwarg_only(),
                       "unsupported keyword-only argument '", args[i].name(),
                       "' (kwargs) in forward: autostage passes model inputs "
                       "positionally; make it a positional argument");
    AUTOSTAGE_CHECK_AS(UnsupportedError, isTensorStructure(args[i].type()),
                       "unsupported model input '", args[i].name(), "' of type ",
                       args[i].type()->annotation_str(),
                       ": expected a tensor or a tuple/list of tensors");
    names.push_back(args[i].name());
  }
  AUTOSTAGE_CHECK(names.size() == inputs.size(), "forward takes ", names.size(), " inputs but ",
                  inputs.size(),
                  " example inputs were given; pass one example "
                  "value per forward argument");
  for (size_t i = 0; i < inputs.size(); ++i)
    AUTOSTAGE_CHECK_AS(UnsupportedError,
                       isTensorIValue(inputs[i], "model input '" + names[i] + "'"),
                       "unsupported model input '", names[i], "' holding ", inputs[i].tagKind(),
                       ": expected a tensor or a tuple/list of tensors");
  return names;
}

// Replaces reads of non-tensor module attributes (e.g. `self.training`) by constants, since
// LowerGraph only lifts tensors.
void foldNonTensorAttributes(Graph& graph, const c10::IValue& self) {
  std::unordered_map<const Value*, c10::IValue> objects{{graph.inputs().at(0), self}};
  std::vector<Node*> folded;
  std::function<void(torch::jit::Block*)> visit = [&](torch::jit::Block* block) {
    for (Node* n : block->nodes()) {
      for (torch::jit::Block* b : n->blocks()) visit(b);
      if (n->kind() != c10::prim::GetAttr || !objects.count(n->input())) continue;
      c10::IValue attr = objects.at(n->input()).toObject()->getAttr(n->s(c10::attr::name));
      if (attr.isObject()) {
        objects[n->output()] = attr;
      } else if (!attr.isTensor()) {
        torch::jit::WithInsertPoint guard(n);
        n->output()->replaceAllUsesWith(graph.insertConstant(attr));
        folded.push_back(n);
      }
    }
  };
  visit(graph.block());
  for (Node* n : folded) n->destroy();
}

c10::IValue cloneIValue(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.detach().clone().requires_grad_(t.requires_grad());
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const auto& e : v.toTupleRef().elements()) elements.push_back(cloneIValue(e));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  if (v.isList()) {
    c10::impl::GenericList out(v.toList().elementType());
    for (const auto& e : v.toListRef()) out.push_back(cloneIValue(e));
    return out;
  }
  return v;
}

// Runs the lowered graph once on copies of inputs and parameters, returning the value of every
// graph input and top-level node output.
ValueMap recordValues(Graph& lowered, const std::vector<c10::IValue>& inputs) {
  auto probe = lowered.copy();
  std::vector<const Value*> original(lowered.inputs().begin(), lowered.inputs().end());
  for (const Node* n : lowered.nodes())
    for (const Value* o : n->outputs()) original.push_back(o);
  std::vector<Value*> produced;
  for (Node* n : probe->nodes())
    for (Value* o : n->outputs()) produced.push_back(o);
  while (!probe->outputs().empty()) probe->eraseOutput(0);
  probe->registerOutput(probe->insertNode(probe->createTuple(produced))->output());
  torch::jit::GraphFunction fn("autostage_probe", probe, nullptr, torch::jit::SIMPLE);
  torch::jit::Stack stack;
  for (const auto& v : inputs) stack.push_back(cloneIValue(v));
  ValueMap values;
  for (size_t i = 0; i < stack.size(); ++i) values[original[i]] = stack[i];
  fn.run(stack);
  AUTOSTAGE_INTERNAL_ASSERT(stack.size() == 1 && stack[0].isTuple(), "probe run returned ",
                            stack.size(), " values, expected one tuple");
  const auto& results = stack[0].toTupleRef().elements();
  for (size_t i = 0; i < results.size(); ++i)
    values[original[lowered.inputs().size() + i]] = results[i];
  return values;
}

std::vector<std::string> parameterNames(const torch::jit::Module& module,
                                        const std::vector<c10::IValue>& slots) {
  std::unordered_map<const c10::TensorImpl*, std::string> byTensor;
  for (const auto& p : module.named_parameters(true))
    byTensor.emplace(p.value.unsafeGetTensorImpl(), p.name);
  for (const auto& b : module.named_buffers(true))
    byTensor.emplace(b.value.unsafeGetTensorImpl(), b.name);
  std::vector<std::string> names;
  for (size_t i = 0; i < slots.size(); ++i) {
    auto it = byTensor.find(slots[i].toTensor().unsafeGetTensorImpl());
    names.push_back(it != byTensor.end() ? it->second : "tensor_attribute." + std::to_string(i));
  }
  return names;
}

void checkOutputs(const Graph& graph) {
  for (const Value* v : graph.outputs()) {
    const c10::TypePtr& t = v->type();
    AUTOSTAGE_CHECK_AS(UnsupportedError, t->kind() != c10::TypeKind::DictType,
                       "unsupported dict output (", t->annotation_str(),
                       ") of forward: return a "
                       "tensor or a tuple/list of tensors instead of a dict");
    AUTOSTAGE_CHECK_AS(UnsupportedError, isTensorStructure(t),
                       "unsupported output of forward of "
                       "type ",
                       t->annotation_str(), ": expected a tensor or a tuple/list of tensors");
  }
}

// The top-level TupleConstruct whose elements become the graph outputs, or null.
const Node* flattenedTuple(const Graph& graph) {
  if (graph.outputs().size() != 1) return nullptr;
  const Value* out = graph.outputs()[0];
  bool onlyReturned = out->uses().size() == 1;
  return out->node()->kind() == c10::prim::TupleConstruct && onlyReturned ? out->node() : nullptr;
}

std::string describe(const Node* n) {
  std::string scope = moduleScope(n);
  std::string out = "node " + std::string(n->kind().toQualString());
  if (n->outputs().size() > 0) out += " -> %" + n->outputs()[0]->debugName();
  return scope.empty() ? out : out + " in module '" + scope + "'";
}

class GraphBuilder {
 public:
  GraphBuilder(ImportedModel& model, const ValueMap& values) : model_(model), values_(values) {}

  void addInput(const Value* v, const std::string& name, core::ValueClass cls) {
    const c10::IValue* runtime = &values_.at(v);
    core::Type type = typeFromTorch(v->type(), runtime, "input '" + name + "'");
    ids_[v] = model_.graph.addInput(name, type, cls);
  }

  void addNode(Node* n) {
    std::string where = describe(n);
    std::vector<Value*> inputs(n->inputs().begin(), n->inputs().end());
    std::vector<Value*> captured = capturedValues(n);
    inputs.insert(inputs.end(), captured.begin(), captured.end());
    std::vector<core::ValueId> inputIds;
    for (Value* v : inputs) inputIds.push_back(ids_.at(v));
    std::vector<core::Type> types;
    std::vector<std::string> names;
    for (const Value* o : n->outputs()) {
      auto it = values_.find(o);
      types.push_back(typeFromTorch(o->type(), it == values_.end() ? nullptr : &it->second, where));
      names.push_back(o->hasDebugName() ? o->debugName() : "");
    }
    core::NodeId id = model_.graph.addNode(n->kind().toQualString(), inputIds, types,
                                           attributesFromTorch(n, where), moduleScope(n), names);
    if (n->kind() == c10::prim::Constant)
      constantValue(model_.graph.node(id), types.at(0), where);  // validates exportability
    if (!n->blocks().empty()) model_.graph.setBody(id, nodeBodyText(n, inputs, where));
    for (size_t i = 0; i < n->outputs().size(); ++i)
      ids_[n->output(i)] = model_.graph.node(id).outputs[i];
  }

  void addOutput(const Value* v) { model_.graph.addOutput(ids_.at(v)); }

 private:
  ImportedModel& model_;
  const ValueMap& values_;
  std::unordered_map<const Value*, core::ValueId> ids_;
};

// Note [Effects of control flow as values]
// A scripted loop or branch may update a tensor it does not return (RaNNC's FunctionModel:
// `for b in x: ... b[i] = 0` writes into the input x; the loop has no output at all). Later
// readers of x read the same SSA value as before the loop, so nothing in the graph says they
// must see the loop's effect: a stage cut between them would send (or re-read) x unchanged, and
// an output-less node cannot even be stored as body text (the printer writes ` = prim::Loop`,
// which parseIR rejects). So every top-level prim::Loop / prim::If that writes into a tensor
// defined before it and read after it threads that tensor through: the loop carries it as an
// extra loop-carried value returned unchanged by its body (the branch returns it from both
// blocks), and the readers after the node read that new output, the same tensor at run time.
bool within(const torch::jit::Node* node, const torch::jit::Node* ancestor) {
  for (const torch::jit::Block* b = node->owningBlock(); b != nullptr;
       b = b->owningNode() ? b->owningNode()->owningBlock() : nullptr)
    if (b->owningNode() == ancestor) return true;
  return false;
}

// Tensors defined outside `node` (inputs or captured by its blocks) it writes into and that a
// node after it (or the graph's return) reads.
std::vector<torch::jit::Value*> writtenAndReadAfter(torch::jit::Node* node,
                                                    const torch::jit::AliasDb& aliases) {
  std::vector<torch::jit::Value*> candidates;
  std::unordered_set<const torch::jit::Value*> seen;
  std::function<void(torch::jit::Block*)> visit = [&](torch::jit::Block* block) {
    for (torch::jit::Node* n : block->nodes()) {
      for (torch::jit::Value* v : n->inputs())
        if (v->type()->kind() == c10::TypeKind::TensorType && !within(v->node(), node) &&
            v->node() != node && seen.insert(v).second)
          candidates.push_back(v);
      for (torch::jit::Block* b : n->blocks()) visit(b);
    }
  };
  for (torch::jit::Block* b : node->blocks()) visit(b);
  std::vector<torch::jit::Value*> written;
  for (torch::jit::Value* v : candidates) {
    if (!aliases.writesToAlias(node, {v})) continue;
    for (const torch::jit::Use& use : v->uses()) {
      if (use.user != node && !within(use.user, node) && use.user->isAfter(node)) {
        written.push_back(v);
        break;
      }
    }
  }
  return written;
}

void threadThrough(torch::jit::Node* node, torch::jit::Value* value) {
  torch::jit::Value* after = nullptr;
  if (node->kind() == torch::jit::prim::Loop) {
    node->addInput(value);
    torch::jit::Block* body = node->blocks()[0];
    body->registerOutput(body->addInput()->setType(value->type()));
    after = node->addOutput()->setType(value->type());
  } else {
    for (torch::jit::Block* b : node->blocks()) b->registerOutput(value);
    after = node->addOutput()->setType(value->type());
  }
  std::vector<torch::jit::Use> uses = value->uses();
  for (const torch::jit::Use& use : uses)
    if (use.user != node && !within(use.user, node) && use.user->isAfter(node))
      use.user->replaceInput(use.offset, after);
}

void threadControlFlowEffects(const std::shared_ptr<Graph>& graph) {
  for (torch::jit::Node* node : graph->nodes()) {
    if (node->kind() != torch::jit::prim::Loop && node->kind() != torch::jit::prim::If) continue;
    torch::jit::AliasDb aliases(graph);  // rebuilt: the previous node's threading changed uses
    for (torch::jit::Value* v : writtenAndReadAfter(node, aliases)) threadThrough(node, v);
  }
}

// Note [Inlining without autocast]
// Inline takes each called function's optimized graph, and LibTorch's JIT builds that graph with
// its autocast pass while autocast is on: the casts autocast would make at run time become
// explicit nodes (aten::to, aten::_autocast_to_reduced_precision before every linear). The
// importer runs under the stages' autocast (Note [Autocast execution]), so a bf16 model's IR had
// 150 nodes where the fp32 one has 105 (the test's transformer block), and each Q, K and V linear
// read its own cast of the input: no tensor-parallel pattern matched. The stages apply autocast
// at run time anyway, so the graph is inlined with autocast off; only the probe runs under it.
class AutocastOff {
 public:
  AutocastOff()
      : cpu_(isAutocastEnabled(c10::DeviceType::CPU)),
        cuda_(isAutocastEnabled(c10::DeviceType::CUDA)) {
    setAutocastEnabled(c10::DeviceType::CPU, false);
    setAutocastEnabled(c10::DeviceType::CUDA, false);
  }
  ~AutocastOff() {
    setAutocastEnabled(c10::DeviceType::CPU, cpu_);
    setAutocastEnabled(c10::DeviceType::CUDA, cuda_);
  }
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  bool cpu_, cuda_;
};

std::shared_ptr<Graph> inlinedForward(const torch::jit::Module& module) {
  AutocastOff off;  // Note [Inlining without autocast]
  auto graph = module.get_method("forward").graph()->copy();
  torch::jit::Inline(*graph);
  foldNonTensorAttributes(*graph, module._ivalue());
  torch::jit::EliminateDeadCode(graph);  // e.g. leftover Function constants of inlined calls
  return graph;
}

}  // namespace

std::string moduleScope(const Node* node) {
  const std::string prefix = "__module.";
  auto scope = const_cast<Node*>(node)->scope();  // Node::scope() is not const
  if (scope && !scope->isBlank()) {
    std::string name = scope->name().toUnqualString();
    return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : "";
  }
  std::string path;
  if (auto stack = node->callstack()) {
    for (const auto& entry : (*stack)->vec()) {
      const auto& info = std::get<2>(entry);
      if (!info || info->instance_name().empty()) continue;
      path += (path.empty() ? "" : ".") + info->instance_name();
    }
  }
  return path;
}

ImportedModel importModule(const torch::jit::Module& module,
                           const std::vector<c10::IValue>& exampleInputs) {
  const auto& schema = module.get_method("forward").function().getSchema();
  std::vector<std::string> argNames = checkForwardArguments(schema, exampleInputs);
  std::pair<std::shared_ptr<Graph>, std::vector<c10::IValue>> lowered;
  try {
    lowered = torch::jit::LowerGraph(*inlinedForward(module), module._ivalue());
  } catch (const c10::Error& e) {
    throw UnsupportedError(std::string("cannot lift the module's attributes to graph inputs: ") +
                           e.what_without_backtrace());
  }
  auto& [graph, slots] = lowered;
  // Note [In-place ops on fresh values]: a traced in-place op on a value the graph made itself
  // (`features *= size` on a traced int turned tensor) becomes its out-of-place form, and the
  // readers after it read its result. Nodes of autostage's IR run more than once from kept
  // values (the profiler's calibration and prefix runs); an in-place op there would update its
  // kept input again on every run (RaNNC's BasicModel: 16*6*6 came out 6x too large). Mutation
  // of graph inputs, parameters and their aliases is left as traced (the pass proves safety).
  torch::jit::RemoveTensorMutation(graph);
  threadControlFlowEffects(graph);  // Note [Effects of control flow as values]
  checkOutputs(*graph);
  std::vector<c10::IValue> allInputs = exampleInputs;
  allInputs.insert(allInputs.end(), slots.begin(), slots.end());
  ValueMap values = recordValues(*graph, allInputs);

  ImportedModel model{core::Graph(module.type()->name()->name()), {}, {}, false};
  model.paramNames = parameterNames(module, slots);
  for (const auto& s : slots) model.paramTensors.push_back(s.toTensor());
  GraphBuilder builder(model, values);
  for (size_t i = 0; i < graph->inputs().size(); ++i) {
    bool isArg = i < argNames.size();
    builder.addInput(graph->inputs()[i],
                     isArg ? argNames[i] : model.paramNames[i - argNames.size()],
                     isArg ? core::ValueClass::Batch : core::ValueClass::Param);
  }
  const Node* tuple = flattenedTuple(*graph);
  for (Node* n : graph->nodes())
    if (n != tuple) builder.addNode(n);
  model.tupleOutput = tuple != nullptr;
  std::vector<const Value*> outputs(graph->outputs().begin(), graph->outputs().end());
  if (tuple) outputs.assign(tuple->inputs().begin(), tuple->inputs().end());
  for (const Value* v : outputs) builder.addOutput(v);
  model.graph.classifyValues();
  model.graph.verify();
  core::logger("Module")->debug("imported '{}': {} nodes, {} parameters/buffers",
                                model.graph.name(), model.graph.nodeCount(), slots.size());
  return model;
}

}  // namespace autostage::torchscript
