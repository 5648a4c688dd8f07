#pragma once
// Python objects <-> c10::IValue, for the values the bindings pass to and from TorchScript:
// tensors, None, bool, int, float, str, torch.device, and tuples, lists and dicts of them.
//
// Note [No torch-internal pybind helpers]
// torch/csrc/jit/python/pybind_utils.h (toIValue, toTypeInferredIValue, toPyObject) is inline
// code calling torch-internal functions such as torch::jit::detail::_tryToInferTypeImpl, which
// the pip LibTorch 2.x wheels' libtorch_python.so does not export: an extension built with it
// fails to import ("undefined symbol"). These conversions use only the at::Tensor caster of
// torch/csrc/utils/pybind.h (exported for C++ extensions) and c10's IValue and type API.

#include <ATen/core/ivalue.h>
#include <pybind11/pybind11.h>

namespace autostage::bindings {

// A list's element type and a dict's key and value types are the unified types of the elements,
// with tensor shapes dropped (List[Tensor], as torch.jit.trace types them); an empty list is a
// List[Tensor], an empty dict a Dict[str, Tensor]. Throws UnsupportedError for other objects and
// for lists/dicts mixing incompatible types.
c10::IValue toIValue(pybind11::handle obj);

// Throws UnsupportedError for values of other kinds (objects, futures, ...).
pybind11::object toPython(const c10::IValue& value);

}  // namespace autostage::bindings
