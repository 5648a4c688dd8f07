#include "frontend/export/dtype.h"

#include <utility>
#include <vector>

#include "core/error.h"

namespace autostage::exportfe {
namespace {

const std::vector<std::pair<core::DType, at::ScalarType>>& dtypeTable() {
  static const std::vector<std::pair<core::DType, at::ScalarType>> table = {
      {core::DType::Float32, at::kFloat}, {core::DType::Float64, at::kDouble},
      {core::DType::Float16, at::kHalf},  {core::DType::BFloat16, at::kBFloat16},
      {core::DType::Int64, at::kLong},    {core::DType::Int32, at::kInt},
      {core::DType::Int16, at::kShort},   {core::DType::Int8, at::kChar},
      {core::DType::UInt8, at::kByte},    {core::DType::Bool, at::kBool}};
  return table;
}

}  // namespace

core::DType dtypeFromTorch(at::ScalarType type, const std::string& where) {
  for (const auto& [dtype, scalar] : dtypeTable())
    if (scalar == type) return dtype;
  throw UnsupportedError(std::string("unsupported dtype ") + c10::toString(type) + " at " + where +
                         ": autostage handles float, double, half, bfloat16, integer and bool "
                         "tensors (not complex or quantized); convert the tensor in the model");
}

at::ScalarType dtypeToTorch(core::DType dtype) {
  for (const auto& [d, scalar] : dtypeTable())
    if (d == dtype) return scalar;
  throw InternalError("dtype " + core::dtypeName(dtype) + " has no LibTorch scalar type");
}

}  // namespace autostage::exportfe
