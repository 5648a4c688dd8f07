// Note [No torch-internal pybind helpers] (ivalue_cast.h)
#include "bindings/python/ivalue_cast.h"

#include <torch/csrc/utils/pybind.h>  // the at::Tensor caster

#include <string>
#include <vector>

#include <ATen/core/jit_type.h>

#include "core/error.h"

namespace autostage::bindings {
namespace {

namespace py = pybind11;

std::string pythonTypeName(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__name__"));
}

// The one TorchScript type of `values` (tensor shapes dropped), or `empty` when there are none.
c10::TypePtr commonType(const std::vector<c10::IValue>& values, const c10::TypePtr& empty,
                        const char* what) {
  if (values.empty()) return empty;
  c10::TypePtr type = c10::unshapedType(values.front().type());
  for (const c10::IValue& value : values) {
    c10::TypePtr next = c10::unshapedType(value.type());
    auto unified = c10::unifyTypes(type, next);
    AUTOSTAGE_CHECK_AS(UnsupportedError, unified.has_value(), "a Python ", what, " mixes ",
                       type->repr_str(), " and ", next->repr_str(),
                       " items; autostage passes lists and dicts to TorchScript, which needs "
                       "one item type");
    type = *unified;
  }
  return type;
}

c10::IValue listToIValue(py::handle obj) {
  std::vector<c10::IValue> items;
  for (py::handle item : obj) items.push_back(toIValue(item));
  c10::impl::GenericList list(commonType(items, c10::TensorType::get(), "list"));
  list.reserve(items.size());
  for (c10::IValue& item : items) list.push_back(std::move(item));
  return list;
}

c10::IValue dictToIValue(py::handle obj) {
  std::vector<c10::IValue> keys, values;
  for (auto [key, value] : py::reinterpret_borrow<py::dict>(obj)) {
    keys.push_back(toIValue(key));
    values.push_back(toIValue(value));
  }
  c10::impl::GenericDict dict(commonType(keys, c10::StringType::get(), "dict's keys"),
                              commonType(values, c10::TensorType::get(), "dict's values"));
  for (size_t i = 0; i < keys.size(); ++i) dict.insert(std::move(keys[i]), std::move(values[i]));
  return dict;
}

}  // namespace

c10::IValue toIValue(py::handle obj) {
  py::detail::make_caster<at::Tensor> tensor;
  if (tensor.load(obj, /*convert=*/false)) return py::detail::cast_op<at::Tensor>(tensor);
  if (obj.is_none()) return c10::IValue();
  if (py::isinstance<py::bool_>(obj)) return obj.cast<bool>();  // before int: bool is an int
  if (py::isinstance<py::int_>(obj)) return obj.cast<int64_t>();
  if (py::isinstance<py::float_>(obj)) return obj.cast<double>();
  if (py::isinstance<py::str>(obj)) return obj.cast<std::string>();
  if (py::isinstance<py::tuple>(obj)) {
    std::vector<c10::IValue> items;
    for (py::handle item : obj) items.push_back(toIValue(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (py::isinstance<py::list>(obj)) return listToIValue(obj);
  if (py::isinstance<py::dict>(obj)) return dictToIValue(obj);
  if (py::isinstance(obj, py::module_::import("torch").attr("device")))
    return c10::Device(obj.attr("__str__")().cast<std::string>());
  AUTOSTAGE_CHECK_AS(UnsupportedError, false, "cannot pass a Python ", pythonTypeName(obj),
                     " to TorchScript: autostage takes tensors, None, bool, int, float, str, "
                     "torch.device and tuples, lists and dicts of them");
  return {};  // not reached
}

py::object toPython(const c10::IValue& value) {
  if (value.isTensor()) return py::cast(value.toTensor());
  if (value.isNone()) return py::none();
  if (value.isBool()) return py::bool_(value.toBool());
  if (value.isInt()) return py::int_(value.toInt());
  if (value.isDouble()) return py::float_(value.toDouble());
  if (value.isString()) return py::str(value.toStringRef());
  if (value.isDevice()) return py::module_::import("torch").attr("device")(value.toDevice().str());
  if (value.isTuple()) {
    const auto& items = value.toTupleRef().elements();
    py::tuple tuple(items.size());
    for (size_t i = 0; i < items.size(); ++i) tuple[i] = toPython(items[i]);
    return std::move(tuple);
  }
  if (value.isList()) {
    c10::impl::GenericList list = value.toList();
    py::list result;
    for (size_t i = 0; i < list.size(); ++i) result.append(toPython(list.get(i)));
    return std::move(result);
  }
  if (value.isGenericDict()) {
    py::dict result;
    for (const auto& entry : value.toGenericDict())
      result[toPython(entry.key())] = toPython(entry.value());
    return std::move(result);
  }
  AUTOSTAGE_CHECK_AS(UnsupportedError, false, "cannot return a TorchScript ", value.tagKind(),
                     " to Python: autostage returns tensors, None, bool, int, float, str, "
                     "torch.device and tuples, lists and dicts of them");
  return {};  // not reached
}

}  // namespace autostage::bindings
