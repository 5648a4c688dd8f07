#include "frontend/torchscript/type_convert.h"

#include <torch/csrc/jit/mobile/type_parser.h>

#include <utility>
#include <vector>

#include "core/error.h"
#include "frontend/export/dtype.h"

namespace autostage::torchscript {
namespace {

core::Type tensorTypeFrom(const c10::TensorTypePtr& type, const c10::IValue* runtime,
                          const std::string& where) {
  if (runtime && runtime->isTensor()) {
    const at::Tensor& t = runtime->toTensor();
    if (!t.defined()) return core::Type::unknownTensor();
    return core::Type::tensor(dtypeFromTorch(t.scalar_type(), where), t.sizes().vec(),
                              t.requires_grad());
  }
  auto sizes = type->sizes().concrete_sizes();
  if (type->scalarType() && sizes)
    return core::Type::tensor(dtypeFromTorch(*type->scalarType(), where), *sizes,
                              type->requiresGrad().value_or(false));
  return core::Type::unknownTensor();
}

core::Type tupleTypeFrom(const c10::TupleTypePtr& type, const c10::IValue* runtime,
                         const std::string& where) {
  std::vector<core::Type> elements;
  const auto& types = type->elements();
  for (size_t i = 0; i < types.size(); ++i) {
    const c10::IValue* element = nullptr;
    if (runtime && runtime->isTuple() && runtime->toTupleRef().elements().size() == types.size())
      element = &runtime->toTupleRef().elements()[i];
    elements.push_back(typeFromTorch(types[i], element, where));
  }
  return core::Type::tuple(std::move(elements));
}

// Types the mobile type parser does not know by their annotation string.
c10::TypePtr namedTypeToTorch(const std::string& name) {
  if (name == "Scalar") return c10::NumberType::get();
  if (name == "Generator") return c10::GeneratorType::get();
  if (name == "Any") return c10::AnyType::get();
  if (name == "Storage") return c10::StorageType::get();
  if (name == "Layout") return c10::LayoutType::get();
  if (name == "ScalarType") return c10::ScalarTypeType::get();
  if (name == "MemoryFormat") return c10::MemoryFormatType::get();
  try {
    return c10::parseType(name);
  } catch (const std::exception& e) {
    throw UnsupportedError("cannot export a value of TorchScript type '" + name +
                           "': the type is not representable (" + e.what() +
                           "); keep nodes using it out of exported subgraphs");
  }
}

}  // namespace

core::DType dtypeFromTorch(at::ScalarType type, const std::string& where) {
  return exportfe::dtypeFromTorch(type, where);
}

at::ScalarType dtypeToTorch(core::DType dtype) { return exportfe::dtypeToTorch(dtype); }

core::Type typeFromTorch(const c10::TypePtr& type, const c10::IValue* runtime,
                         const std::string& where) {
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return tensorTypeFrom(type->expect<c10::TensorType>(), runtime, where);
    case c10::TypeKind::IntType:
      return core::Type::scalar(core::TypeKind::Int);
    case c10::TypeKind::FloatType:
      return core::Type::scalar(core::TypeKind::Float);
    case c10::TypeKind::BoolType:
      return core::Type::scalar(core::TypeKind::Bool);
    case c10::TypeKind::StringType:
      return core::Type::scalar(core::TypeKind::String);
    case c10::TypeKind::DeviceObjType:
      return core::Type::scalar(core::TypeKind::Device);
    case c10::TypeKind::NoneType:
      return core::Type::scalar(core::TypeKind::None);
    case c10::TypeKind::ListType:
      return core::Type::list(
          typeFromTorch(type->expect<c10::ListType>()->getElementType(), nullptr, where));
    case c10::TypeKind::TupleType:
      return tupleTypeFrom(type->expect<c10::TupleType>(), runtime, where);
    case c10::TypeKind::OptionalType: {
      const c10::IValue* inner = runtime && !runtime->isNone() ? runtime : nullptr;
      return core::Type::optional(
          typeFromTorch(type->expect<c10::OptionalType>()->getElementType(), inner, where));
    }
    default:
      return core::Type::other(type->annotation_str());
  }
}

c10::TypePtr typeToTorch(const core::Type& type) {
  switch (type.kind()) {
    case core::TypeKind::Tensor:
      return c10::TensorType::get();
    case core::TypeKind::Int:
      return c10::IntType::get();
    case core::TypeKind::Float:
      return c10::FloatType::get();
    case core::TypeKind::Bool:
      return c10::BoolType::get();
    case core::TypeKind::String:
      return c10::StringType::get();
    case core::TypeKind::Device:
      return c10::DeviceObjType::get();
    case core::TypeKind::None:
      return c10::NoneType::get();
    case core::TypeKind::List:
      return c10::ListType::create(typeToTorch(type.elements().at(0)));
    case core::TypeKind::Optional:
      return c10::OptionalType::create(typeToTorch(type.elements().at(0)));
    case core::TypeKind::Tuple: {
      std::vector<c10::TypePtr> elements;
      for (const auto& e : type.elements()) elements.push_back(typeToTorch(e));
      return c10::TupleType::create(std::move(elements));
    }
    case core::TypeKind::Other:
      return namedTypeToTorch(type.otherName());
  }
  throw InternalError("unhandled IR type kind in typeToTorch");
}

bool isTensorStructure(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto list = type->cast<c10::ListType>()) return isTensorStructure(list->getElementType());
  if (auto tuple = type->cast<c10::TupleType>()) {
    for (const auto& e : tuple->elements())
      if (!isTensorStructure(e)) return false;
    return true;
  }
  return false;
}

}  // namespace autostage::torchscript
