#pragma once
// LibTorch scalar types <-> IR dtypes, one table for both front ends (the TorchScript importer's
// frontend/torchscript/type_convert.h forwards here: it may include frontend/export, not the reverse).

#include <c10/core/ScalarType.h>

#include <string>

#include "core/ir/type.h"

namespace autostage::exportfe {

// The IR dtype of `type`; UnsupportedError naming `where` for complex, quantized and other types
// the IR does not carry.
core::DType dtypeFromTorch(at::ScalarType type, const std::string& where);
// The LibTorch scalar type of `dtype`.
at::ScalarType dtypeToTorch(core::DType dtype);

}  // namespace autostage::exportfe
