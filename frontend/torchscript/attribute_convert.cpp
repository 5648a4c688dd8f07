#include "frontend/torchscript/attribute_convert.h"

#include <ATen/ATen.h>

#include <cstring>

#include "core/error.h"
#include "frontend/torchscript/type_convert.h"

namespace autostage::torchscript {
namespace {

using torch::jit::AttributeKind;

// Lists stored as IValue attributes (how TorchScript stores list constants).
core::AttributeValue listFromIValue(const c10::IValue& value, const std::string& where) {
  if (value.isIntList()) return value.toIntVector();
  if (value.isDoubleList()) return value.toDoubleVector();
  if (value.isBoolList()) {
    std::vector<int64_t> out;
    for (bool b : value.toBoolList()) out.push_back(b ? 1 : 0);
    return out;
  }
  if (value.isList() && value.type()->expectRef<c10::ListType>().getElementType()->kind() ==
                            c10::TypeKind::StringType) {
    std::vector<std::string> out;
    for (const c10::IValue& s : value.toListRef()) out.push_back(s.toStringRef());
    return out;
  }
  throw UnsupportedError("unsupported constant " + value.type()->annotation_str() + " at " + where +
                         ": constants must be scalars, tensors, or lists of int/float/bool/str");
}

core::AttributeValue attributeFromTorch(const torch::jit::Node* node, torch::jit::Symbol name,
                                        const std::string& where) {
  switch (node->kindOf(name)) {
    case AttributeKind::i:
      return node->i(name);
    case AttributeKind::f:
      return node->f(name);
    case AttributeKind::s:
      return node->s(name);
    case AttributeKind::is:
      return node->is(name);
    case AttributeKind::fs:
      return node->fs(name);
    case AttributeKind::ss:
      return node->ss(name);
    case AttributeKind::t:
      return tensorDataFromTorch(node->t(name), where);
    case AttributeKind::ival:
      return listFromIValue(node->ival(name), where);
    default:
      throw UnsupportedError(std::string("unsupported attribute kind '") +
                             torch::jit::toString(node->kindOf(name)) + "' (attribute " +
                             name.toUnqualString() + ") at " + where);
  }
}

template <typename T>
const T* attributeAs(const core::Node& node) {
  const core::Attribute* a = node.findAttribute("value");
  return a ? std::get_if<T>(&a->value) : nullptr;
}

c10::IValue listConstant(const core::Node& node, const core::Type& elementType) {
  if (elementType.kind() == core::TypeKind::Int) {
    if (auto v = attributeAs<std::vector<int64_t>>(node)) return c10::List<int64_t>(*v);
  } else if (elementType.kind() == core::TypeKind::Bool) {
    if (auto v = attributeAs<std::vector<int64_t>>(node)) {
      c10::List<bool> out;
      for (int64_t b : *v) out.push_back(b != 0);
      return out;
    }
  } else if (elementType.kind() == core::TypeKind::Float) {
    if (auto v = attributeAs<std::vector<double>>(node)) return c10::List<double>(*v);
  } else if (elementType.kind() == core::TypeKind::String) {
    if (auto v = attributeAs<std::vector<std::string>>(node)) return c10::List<std::string>(*v);
  }
  return c10::IValue();
}

c10::IValue scalarConstant(const core::Node& node, const core::Type& type) {
  switch (type.kind()) {
    case core::TypeKind::Int:
      if (auto v = attributeAs<int64_t>(node)) return *v;
      break;
    case core::TypeKind::Bool:
      if (auto v = attributeAs<int64_t>(node)) return *v != 0;
      break;
    case core::TypeKind::Float:
      if (auto v = attributeAs<double>(node)) return *v;
      break;
    case core::TypeKind::String:
      if (auto v = attributeAs<std::string>(node)) return *v;
      break;
    case core::TypeKind::Device:
      if (auto v = attributeAs<std::string>(node)) return c10::Device(*v);
      break;
    case core::TypeKind::Tensor:
      if (auto v = attributeAs<core::TensorData>(node)) return tensorDataToTorch(*v);
      break;
    default:
      break;
  }
  return c10::IValue();
}

}  // namespace

std::vector<core::Attribute> attributesFromTorch(const torch::jit::Node* node,
                                                 const std::string& where) {
  std::vector<core::Attribute> out;
  for (torch::jit::Symbol name : node->attributeNames())
    out.push_back({name.toUnqualString(), attributeFromTorch(node, name, where)});
  return out;
}

void attributesToTorch(const std::vector<core::Attribute>& attributes, torch::jit::Node* node) {
  for (const core::Attribute& a : attributes) {
    auto name = torch::jit::Symbol::attr(a.name);
    struct Setter {
      torch::jit::Node* n;
      torch::jit::Symbol s;
      void operator()(int64_t v) const { n->i_(s, v); }
      void operator()(double v) const { n->f_(s, v); }
      void operator()(const std::string& v) const { n->s_(s, v); }
      void operator()(const std::vector<int64_t>& v) const { n->is_(s, v); }
      void operator()(const std::vector<double>& v) const { n->fs_(s, v); }
      void operator()(const std::vector<std::string>& v) const { n->ss_(s, v); }
      void operator()(const core::TensorData& v) const { n->t_(s, tensorDataToTorch(v)); }
    };
    std::visit(Setter{node, name}, a.value);
  }
}

c10::IValue constantValue(const core::Node& node, const core::Type& outputType,
                          const std::string& where) {
  if (outputType.kind() == core::TypeKind::None && node.attributes.empty()) return c10::IValue();
  c10::IValue value = outputType.kind() == core::TypeKind::List
                          ? listConstant(node, outputType.elements().at(0))
                          : scalarConstant(node, outputType);
  AUTOSTAGE_CHECK_AS(UnsupportedError, !value.isNone(), "unsupported constant of type ",
                     outputType.toString(), " at ", where,
                     ": expected a None, scalar, device, tensor or list of int/float/bool/str "
                     "constant with a matching 'value' attribute");
  return value;
}

core::TensorData tensorDataFromTorch(const at::Tensor& tensor, const std::string& where) {
  core::TensorData data;
  at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
  data.dtype = dtypeFromTorch(t.scalar_type(), where);
  data.shape = t.sizes().vec();
  data.bytes.assign(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  return data;
}

at::Tensor tensorDataToTorch(const core::TensorData& data) {
  at::Tensor t = at::empty(data.shape, at::TensorOptions().dtype(dtypeToTorch(data.dtype)));
  AUTOSTAGE_CHECK_AS(FormatError, data.bytes.size() == size_t(t.numel() * t.element_size()),
                     "tensor constant has ", data.bytes.size(), " bytes, expected ",
                     t.numel() * t.element_size(), " for shape and dtype ",
                     core::dtypeName(data.dtype));
  if (!data.bytes.empty()) std::memcpy(t.data_ptr(), data.bytes.data(), data.bytes.size());
  return t;
}

}  // namespace autostage::torchscript
