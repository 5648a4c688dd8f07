#pragma once
// Helpers shared by the comm tests: deterministic tensors and per-rank error reporting.

#include <ATen/ATen.h>

#include <exception>
#include <string>
#include <vector>

namespace autostage::comm::testing {

// A tensor of `dtype` and `shape` whose values depend on the element index and `seed`; small
// integers, so sums and averages over 4 ranks are exact in every dtype.
inline at::Tensor pattern(at::ScalarType dtype, at::IntArrayRef shape, int64_t seed) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  at::Tensor values = at::arange(numel, at::kLong).add(seed);
  values = dtype == at::kBool ? values.remainder(2) : values.remainder(13);
  return values.to(dtype).reshape(shape).contiguous();
}

inline const std::vector<at::ScalarType>& allDtypes() {
  static const std::vector<at::ScalarType> dtypes = {
      at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong,
      at::kInt,   at::kShort,  at::kChar, at::kByte,     at::kBool};
  return dtypes;
}

// "" when every rank succeeded, else "rank R: message" of the first failure.
inline std::string firstError(const std::vector<std::exception_ptr>& errors) {
  for (size_t rank = 0; rank < errors.size(); ++rank) {
    if (!errors[rank]) continue;
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const std::exception& e) {
      return "rank " + std::to_string(rank) + ": " + e.what();
    }
  }
  return "";
}

// The message of rank `rank`'s exception, "" when it succeeded.
inline std::string errorOf(const std::vector<std::exception_ptr>& errors, int rank) {
  if (!errors[rank]) return "";
  try {
    std::rethrow_exception(errors[rank]);
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace autostage::comm::testing
