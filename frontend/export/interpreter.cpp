#include "frontend/export/interpreter.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "frontend/export/dtype.h"

namespace autostage::exportfe {
namespace {

// Note [Export node kinds]: Python arithmetic on sizes.
enum class Arith {
  Add,
  Sub,
  Mul,
  FloorDiv,
  TrueDiv,
  Mod,
  Neg,
  Pow,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  Max,
  Min
};

const std::unordered_map<std::string, Arith>& arithmeticKinds() {
  static const std::unordered_map<std::string, Arith> kinds = {
      {"add", Arith::Add},         {"sub", Arith::Sub},
      {"mul", Arith::Mul},         {"floordiv", Arith::FloorDiv},
      {"truediv", Arith::TrueDiv}, {"mod", Arith::Mod},
      {"neg", Arith::Neg},         {"pow", Arith::Pow},
      {"eq", Arith::Eq},           {"ne", Arith::Ne},
      {"lt", Arith::Lt},           {"le", Arith::Le},
      {"gt", Arith::Gt},           {"ge", Arith::Ge},
      {"max", Arith::Max},         {"min", Arith::Min}};
  return kinds;
}

int64_t floorDiv(int64_t a, int64_t b) {
  AUTOSTAGE_CHECK(b != 0, "integer division by zero in a size computation of the model");
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

c10::IValue arithmetic(Arith op, const std::vector<c10::IValue>& in) {
  auto isInt = [](const c10::IValue& v) { return v.isInt() || v.isBool(); };
  auto asInt = [](const c10::IValue& v) { return v.isBool() ? int64_t(v.toBool()) : v.toInt(); };
  auto asDouble = [&](const c10::IValue& v) { return isInt(v) ? double(asInt(v)) : v.toDouble(); };
  if (op == Arith::Neg)
    return isInt(in.at(0)) ? c10::IValue(-asInt(in[0])) : c10::IValue(-in[0].toDouble());
  const bool ints = isInt(in.at(0)) && isInt(in.at(1));
  const double a = asDouble(in[0]), b = asDouble(in[1]);
  switch (op) {
    case Arith::Add:
      return ints ? c10::IValue(asInt(in[0]) + asInt(in[1])) : c10::IValue(a + b);
    case Arith::Sub:
      return ints ? c10::IValue(asInt(in[0]) - asInt(in[1])) : c10::IValue(a - b);
    case Arith::Mul:
      return ints ? c10::IValue(asInt(in[0]) * asInt(in[1])) : c10::IValue(a * b);
    case Arith::FloorDiv:
      return ints ? c10::IValue(floorDiv(asInt(in[0]), asInt(in[1])))
                  : c10::IValue(std::floor(a / b));
    case Arith::TrueDiv:
      return c10::IValue(a / b);
    case Arith::Mod:
      if (ints)
        return c10::IValue(asInt(in[0]) - floorDiv(asInt(in[0]), asInt(in[1])) * asInt(in[1]));
      return c10::IValue(a - std::floor(a / b) * b);
    case Arith::Pow:
      if (ints && asInt(in[1]) >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < asInt(in[1]); ++i) r *= asInt(in[0]);
        return c10::IValue(r);
      }
      return c10::IValue(std::pow(a, b));
    case Arith::Eq:
      return c10::IValue(a == b);
    case Arith::Ne:
      return c10::IValue(a != b);
    case Arith::Lt:
      return c10::IValue(a < b);
    case Arith::Le:
      return c10::IValue(a <= b);
    case Arith::Gt:
      return c10::IValue(a > b);
    case Arith::Ge:
      return c10::IValue(a >= b);
    case Arith::Max:
      return ints ? c10::IValue(std::max(asInt(in[0]), asInt(in[1]))) : c10::IValue(std::max(a, b));
    case Arith::Min:
      return ints ? c10::IValue(std::min(asInt(in[0]), asInt(in[1]))) : c10::IValue(std::min(a, b));
    case Arith::Neg:
      break;
  }
  AUTOSTAGE_INTERNAL_ASSERT(false, "unhandled arithmetic operation");
}

std::string describe(const core::Node& node) {
  std::string out = "node " + std::to_string(node.id) + " (" + node.kind + ")";
  return node.scope.empty() ? out : out + " in module '" + node.scope + "'";
}

// The constant of a prim::Constant node (Note [Export node kinds]).
c10::IValue constantOf(const core::Node& node, const core::Type& type) {
  const core::Attribute* attr = node.findAttribute("value");
  core::Type t = type.kind() == core::TypeKind::Optional ? type.elements().at(0) : type;
  if (attr == nullptr) return c10::IValue();
  const core::AttributeValue& v = attr->value;
  auto fail = [&] {
    throw UnsupportedError("unsupported constant of type " + type.toString() + " at " +
                           describe(node) +
                           ": the export front end writes None, bool, int, "
                           "float, str, Device and lists of bool/int/float");
  };
  switch (t.kind()) {
    case core::TypeKind::Bool:
      if (!std::holds_alternative<int64_t>(v)) fail();
      return c10::IValue(std::get<int64_t>(v) != 0);
    case core::TypeKind::Int:
      if (!std::holds_alternative<int64_t>(v)) fail();
      return c10::IValue(std::get<int64_t>(v));
    case core::TypeKind::Float:
      if (!std::holds_alternative<double>(v)) fail();
      return c10::IValue(std::get<double>(v));
    case core::TypeKind::String:
      if (!std::holds_alternative<std::string>(v)) fail();
      return c10::IValue(std::get<std::string>(v));
    case core::TypeKind::Device:
      if (!std::holds_alternative<std::string>(v)) fail();
      return c10::IValue(c10::Device(std::get<std::string>(v)));
    case core::TypeKind::List: {
      core::TypeKind element = t.elements().at(0).kind();
      if (element == core::TypeKind::Float && std::holds_alternative<std::vector<double>>(v))
        return c10::IValue(c10::List<double>(std::get<std::vector<double>>(v)));
      if (!std::holds_alternative<std::vector<int64_t>>(v)) fail();
      const auto& ints = std::get<std::vector<int64_t>>(v);
      if (element == core::TypeKind::Float)  // an empty list or whole numbers
        return c10::IValue(c10::List<double>(std::vector<double>(ints.begin(), ints.end())));
      if (element == core::TypeKind::Int) return c10::IValue(c10::List<int64_t>(ints));
      if (element == core::TypeKind::Bool) {
        c10::List<bool> bools;
        for (int64_t b : ints) bools.push_back(b != 0);
        return c10::IValue(bools);
      }
      fail();
      return c10::IValue();
    }
    default:
      fail();
  }
  return c10::IValue();
}

enum class ListKind { Int, Float, Bool, Tensor, OptionalTensor };

ListKind listKindOf(const core::Type& type, const core::Node& node) {
  AUTOSTAGE_CHECK_AS(UnsupportedError, type.kind() == core::TypeKind::List, describe(node),
                     " builds a ", type.toString(), ", not a list");
  const core::Type& e = type.elements().at(0);
  switch (e.kind()) {
    case core::TypeKind::Int:
      return ListKind::Int;
    case core::TypeKind::Float:
      return ListKind::Float;
    case core::TypeKind::Bool:
      return ListKind::Bool;
    case core::TypeKind::Tensor:
      return ListKind::Tensor;
    case core::TypeKind::Optional:
      if (e.elements().at(0).isTensor()) return ListKind::OptionalTensor;
      break;
    default:
      break;
  }
  throw UnsupportedError("unsupported list of " + e.toString() + " at " + describe(node) +
                         ": the export front end runs lists of int, float, bool, Tensor and "
                         "Tensor?");
}

c10::IValue buildList(ListKind kind, const std::vector<c10::IValue>& in) {
  switch (kind) {
    case ListKind::Int: {
      c10::List<int64_t> out;
      for (const auto& v : in) out.push_back(v.toInt());
      return out;
    }
    case ListKind::Float: {
      c10::List<double> out;
      for (const auto& v : in) out.push_back(v.isInt() ? double(v.toInt()) : v.toDouble());
      return out;
    }
    case ListKind::Bool: {
      c10::List<bool> out;
      for (const auto& v : in) out.push_back(v.toBool());
      return out;
    }
    case ListKind::Tensor: {
      c10::List<at::Tensor> out;
      for (const auto& v : in) out.push_back(v.toTensor());
      return out;
    }
    case ListKind::OptionalTensor: {
      c10::List<c10::optional<at::Tensor>> out;  // c10::optional: 1.13 (std::optional on 2.x)
      for (const auto& v : in)
        out.push_back(v.isNone() ? c10::optional<at::Tensor>() : v.toTensor());
      return out;
    }
  }
  return c10::IValue();
}

// A Python number passed for a Tensor argument becomes a wrapped-number tensor, as PyTorch's
// Python binding makes it (Note [Export node kinds]).
bool takesTensor(const c10::Argument& argument) {
  const c10::TypePtr& type = argument.type();
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto optional = type->cast<c10::OptionalType>())
    return optional->getElementType()->kind() == c10::TypeKind::TensorType;
  return false;
}

c10::IValue wrapNumber(const c10::IValue& v) {
  if (!(v.isInt() || v.isDouble() || v.isBool())) return v;
  at::Tensor t = c10::scalar_to_tensor(v.toScalar());
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// A failing operator names the IR node (kernel errors name only the operator), in one line
// (what_without_backtrace(), which the profiler and the stage errors quote); it stays a
// c10::Error. Out-of-memory errors keep their type (the profiler and
// memory checks catch them).
template <typename Step>
void callOperator(const Step& step, std::vector<c10::IValue>& stack) {
  try {
    if (step.reshape) {  // Note [View of a dropped contiguous]
      std::vector<c10::IValue> arguments = stack;
      try {
        step.op->callBoxed(stack);
      } catch (const c10::Error& e) {
        if (std::string(e.what_without_backtrace()).find("view size is not compatible") ==
            std::string::npos)
          throw;
        stack = std::move(arguments);
        step.reshape->callBoxed(stack);
      }
      return;
    }
    step.op->callBoxed(stack);
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const c10::Error& e) {
    std::string message = e.what_without_backtrace();
    for (char& c : message)
      if (c == '\n') c = ' ';
    throw c10::Error(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                     step.where + " failed: " + message);
  }
}

}  // namespace

struct Program::Impl {
  enum class StepKind { Operator, Constant, List, Arithmetic };
  struct Step {
    StepKind kind;
    std::optional<c10::OperatorHandle> op;
    std::optional<c10::OperatorHandle> reshape;  // aten::view only
    c10::IValue constant;
    ListKind list = ListKind::Int;
    Arith arith = Arith::Add;
    std::vector<int> inputs, outputs;
    std::vector<bool> wrap;    // per input: a number for a Tensor argument
    std::vector<int> release;  // slots whose last reader is this step
    std::string where;
  };
  std::vector<Step> steps;
  size_t inputCount = 0;
  std::vector<int> outputs;
  int slotCount = 0;

  Step compile(const core::Graph& graph, const core::Node& node,
               const std::unordered_map<core::ValueId, int>& slots);
};

bool isOverloadKind(const std::string& kind) {
  size_t sep = kind.find("::");
  return sep != std::string::npos && kind.find('.', sep + 2) != std::string::npos;
}

bool isExportGraph(const core::Graph& graph) {
  for (const core::Node& n : graph.nodes())
    if (isOverloadKind(n.kind)) return true;
  return false;
}

Program::Impl::Step Program::Impl::compile(const core::Graph& graph, const core::Node& node,
                                           const std::unordered_map<core::ValueId, int>& slots) {
  Step step;
  step.where = describe(node);
  for (core::ValueId v : node.inputs) step.inputs.push_back(slots.at(v));
  if (node.kind == "prim::Constant") {
    step.kind = StepKind::Constant;
    AUTOSTAGE_CHECK_AS(UnsupportedError, node.outputs.size() == 1, step.where, " has ",
                       node.outputs.size(), " outputs; a constant has one");
    step.constant = constantOf(node, graph.value(node.outputs[0]).type);
  } else if (node.kind == "prim::ListConstruct") {
    step.kind = StepKind::List;
    step.list = listKindOf(graph.value(node.outputs.at(0)).type, node);
  } else if (node.kind.rfind("_operator::", 0) == 0) {
    step.kind = StepKind::Arithmetic;
    auto it = arithmeticKinds().find(node.kind.substr(11));
    AUTOSTAGE_CHECK_AS(UnsupportedError, it != arithmeticKinds().end(), "unsupported ", step.where,
                       ": the export front end runs the size arithmetic "
                       "add/sub/mul/floordiv/truediv/mod/neg/pow/comparisons/max/min");
    step.arith = it->second;
  } else {
    AUTOSTAGE_CHECK_AS(UnsupportedError, isOverloadKind(node.kind), "unsupported ", step.where,
                       " in a graph captured by torch.export: expected an operator overload "
                       "(ns::name.overload), prim::Constant, prim::ListConstruct or _operator::*");
    step.kind = StepKind::Operator;
    size_t dot = node.kind.find('.', node.kind.find("::") + 2);
    std::string name = node.kind.substr(0, dot), overload = node.kind.substr(dot + 1);
    auto handle =
        c10::Dispatcher::singleton().findSchema({name, overload == "default" ? "" : overload});
    AUTOSTAGE_CHECK_AS(UnsupportedError, handle.has_value(), "unsupported ", step.where,
                       ": the ATen dispatcher has no operator ", node.kind,
                       " (a custom operator must be registered in every rank's process)");
    step.op = *handle;
    const auto& arguments = handle->schema().arguments();
    AUTOSTAGE_CHECK_AS(UnsupportedError, arguments.size() == node.inputs.size(), step.where,
                       " has ", node.inputs.size(), " inputs, but its schema ",
                       c10::toString(handle->schema()), " takes ", arguments.size(),
                       " arguments; the graph was not written by this front end");
    for (const c10::Argument& a : arguments) step.wrap.push_back(takesTensor(a));
    if (node.kind == "aten::view.default")
      step.reshape = c10::Dispatcher::singleton().findSchemaOrThrow("aten::reshape", "");
  }
  return step;
}

Program::Program(const core::Graph& graph, const std::vector<core::NodeId>& nodes,
                 const std::vector<core::ValueId>& inputs,
                 const std::vector<core::ValueId>& outputs)
    : impl_(std::make_unique<Impl>()) {
  std::unordered_map<core::ValueId, int> slots;
  for (core::ValueId v : inputs) slots.emplace(v, impl_->slotCount++);
  impl_->inputCount = inputs.size();
  for (core::NodeId id : nodes) {
    const core::Node& node = graph.node(id);
    for (core::ValueId o : node.outputs) slots.emplace(o, impl_->slotCount++);
    impl_->steps.push_back(impl_->compile(graph, node, slots));
    for (core::ValueId o : node.outputs) impl_->steps.back().outputs.push_back(slots.at(o));
  }
  for (core::ValueId v : outputs) impl_->outputs.push_back(slots.at(v));
  // Each slot is dropped after its last reader, so activations live no longer than in eager
  // execution (autograd keeps what backward needs).
  std::vector<int> lastReader(impl_->slotCount, -1);
  for (size_t i = 0; i < impl_->steps.size(); ++i)
    for (int s : impl_->steps[i].inputs) lastReader[s] = int(i);
  for (int s : impl_->outputs) lastReader[s] = -1;
  for (int s = 0; s < impl_->slotCount; ++s)
    if (lastReader[s] >= 0) impl_->steps[lastReader[s]].release.push_back(s);
}

Program::~Program() = default;

size_t Program::inputCount() const { return impl_->inputCount; }
size_t Program::outputCount() const { return impl_->outputs.size(); }

std::vector<c10::IValue> Program::run(std::vector<c10::IValue> inputs) const {
  AUTOSTAGE_CHECK(inputs.size() == impl_->inputCount, "the exported subgraph takes ",
                  impl_->inputCount, " inputs (its boundary values), but ", inputs.size(),
                  " were given");
  std::vector<c10::IValue> slots(impl_->slotCount);
  for (size_t i = 0; i < inputs.size(); ++i) slots[i] = std::move(inputs[i]);
  std::vector<c10::IValue> stack;
  for (const Impl::Step& step : impl_->steps) {
    stack.clear();
    for (int s : step.inputs) stack.push_back(slots[s]);
    switch (step.kind) {
      case Impl::StepKind::Constant:
        stack.assign(1, step.constant);
        break;
      case Impl::StepKind::List: {
        c10::IValue list = buildList(step.list, stack);
        stack.assign(1, std::move(list));
        break;
      }
      case Impl::StepKind::Arithmetic: {
        c10::IValue result = arithmetic(step.arith, stack);
        stack.assign(1, std::move(result));
        break;
      }
      case Impl::StepKind::Operator:
        for (size_t i = 0; i < stack.size(); ++i)
          if (step.wrap[i]) stack[i] = wrapNumber(stack[i]);
        callOperator(step, stack);
        break;
    }
    if (stack.size() == 1 && step.outputs.size() != 1 && stack[0].isTensorList()) {
      std::vector<at::Tensor> elements = stack[0].toTensorVector();  // one output per element
      stack.assign(elements.begin(), elements.end());
    }
    AUTOSTAGE_CHECK(stack.size() == step.outputs.size(), step.where, " returned ", stack.size(),
                    " values where the captured graph has ", step.outputs.size(),
                    "; a list's length changed with the input (capture with this shape)");
    for (size_t i = 0; i < stack.size(); ++i) slots[step.outputs[i]] = std::move(stack[i]);
    for (int s : step.release) slots[s] = c10::IValue();
  }
  std::vector<c10::IValue> out;
  out.reserve(impl_->outputs.size());
  for (int s : impl_->outputs) out.push_back(slots[s]);
  return out;
}

void recordTypes(core::Graph& graph, std::vector<c10::IValue> inputs) {
  std::vector<core::NodeId> nodes(graph.nodeCount());
  for (size_t i = 0; i < nodes.size(); ++i) nodes[i] = core::NodeId(i);
  std::vector<core::ValueId> produced;
  for (const core::Node& n : graph.nodes())
    produced.insert(produced.end(), n.outputs.begin(), n.outputs.end());
  Program probe(graph, nodes, graph.inputs(), produced);
  std::vector<c10::IValue> values = probe.run(std::move(inputs));
  for (size_t i = 0; i < produced.size(); ++i) {
    if (!values[i].isTensor() || !graph.value(produced[i]).type.isTensor()) continue;
    const at::Tensor& t = values[i].toTensor();
    if (!t.defined()) continue;
    const std::string where = "value %" + graph.value(produced[i]).name;
    graph.setType(produced[i], core::Type::tensor(dtypeFromTorch(t.scalar_type(), where),
                                                  t.sizes().vec(), t.requires_grad()));
  }
  graph.classifyValues();
}

}  // namespace autostage::exportfe
