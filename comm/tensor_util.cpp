#include "comm/tensor_util.h"

#include <sstream>

#include "core/error.h"

namespace autostage::comm {

std::string describeTensor(const at::Tensor& tensor) {
  if (!tensor.defined()) return "undefined tensor";
  std::ostringstream out;
  out << c10::toString(tensor.scalar_type()) << "[";
  for (int64_t d = 0; d < tensor.dim(); ++d) out << (d ? ", " : "") << tensor.size(d);
  out << "]";
  return out.str();
}

namespace {
bool supportedDtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kLong:
    case at::kInt:
    case at::kShort:
    case at::kChar:
    case at::kByte:
    case at::kBool:
      return true;
    default:
      return false;
  }
}
}  // namespace

void checkCommTensor(const at::Tensor& tensor, c10::DeviceType deviceType, const char* operation) {
  checkCommTensor(tensor, {deviceType}, operation);
}

void checkCommTensor(const at::Tensor& tensor, std::initializer_list<c10::DeviceType> deviceTypes,
                     const char* operation) {
  AUTOSTAGE_CHECK(tensor.defined(), operation, ": expected a defined tensor, got an undefined one");
  std::string expected;
  bool found = false;
  for (c10::DeviceType type : deviceTypes) {
    expected += (expected.empty() ? "" : " or ") + c10::DeviceTypeName(type);
    found = found || tensor.device().type() == type;
  }
  AUTOSTAGE_CHECK(found, operation, ": expected a ", expected, " tensor, got one on ",
                  tensor.device().str(), "; use the backend for that device");
  AUTOSTAGE_CHECK(tensor.is_contiguous(), operation, ": expected a contiguous tensor, got ",
                  describeTensor(tensor), " with strides ", tensor.strides(),
                  "; call .contiguous() first");
  AUTOSTAGE_CHECK_AS(UnsupportedError, supportedDtype(tensor.scalar_type()), operation, ": dtype ",
                     c10::toString(tensor.scalar_type()),
                     " is not supported; use float32/64, float16, bfloat16, int64/32/16/8, "
                     "uint8 or bool");
}

void checkAverageable(const at::Tensor& tensor) {
  AUTOSTAGE_CHECK(at::isFloatingType(tensor.scalar_type()),
                  "allReduce(Average) needs a floating-point tensor, got ", describeTensor(tensor),
                  "; use ReduceOp::Sum and divide yourself");
}

int64_t tensorBytes(const at::Tensor& tensor) {
  return tensor.numel() * static_cast<int64_t>(tensor.element_size());
}

void accumulate(const at::Tensor& into, const at::Tensor& other) {
  if (into.scalar_type() == at::kBool)
    into.logical_or_(other);
  else
    into.add_(other);
}

}  // namespace autostage::comm
