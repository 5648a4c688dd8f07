#pragma once
// Conversions between LibTorch types/values and IR types (core::Type, core::DType).
//
// Import direction: a TorchScript static type refined by the value seen at run time (shapes and
// dtypes come from the example run, so they are complete even without shape information in the
// TorchScript graph). Export direction: the TorchScript type a value must carry so that operator
// overloads resolve as in the original graph (tensors are exported without shape, which does not
// affect execution).

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <string>

#include "core/ir/type.h"

namespace autostage::torchscript {

// Throws UnsupportedError naming `where` for dtypes the IR does not carry (complex, quantized,
// ...).
core::DType dtypeFromTorch(at::ScalarType type, const std::string& where);
at::ScalarType dtypeToTorch(core::DType dtype);

// IR type of a TorchScript value with static type `type`; `runtime` (may be null) is the value
// seen in the example run and supplies dtype, shape and requires_grad of tensors.
core::Type typeFromTorch(const c10::TypePtr& type, const c10::IValue* runtime,
                         const std::string& where);

// TorchScript type for an IR type. Throws UnsupportedError for an `Other` type it cannot name.
c10::TypePtr typeToTorch(const core::Type& type);

// True when `type` is a tensor or a (nested) tuple/list of tensors.
bool isTensorStructure(const c10::TypePtr& type);

}  // namespace autostage::torchscript
