#include "core/torchscript/autocast.h"

#include <ATen/autocast_mode.h>

#include "core/error.h"

namespace autostage::torchscript {

void checkAutocastSupported(core::Precision precision, c10::DeviceType device) {
  AUTOSTAGE_CHECK_AS(UnsupportedError,
                     !(precision == core::Precision::Fp16 && device == c10::DeviceType::CPU),
                     "precision=fp16 is not supported on a CPU backend: CPU autocast in LibTorch "
                     "1.13 supports only bfloat16; use precision=bf16 on CPU (fp16 needs the "
                     "NCCL/CUDA backend)");
  AUTOSTAGE_CHECK_AS(UnsupportedError,
                     precision == core::Precision::Fp32 || device == c10::DeviceType::CPU ||
                         device == c10::DeviceType::CUDA,
                     "precision=", core::precisionName(precision), " needs a CPU or CUDA device, "
                     "not ", c10::DeviceTypeName(device));
}

c10::ScalarType autocastDtype(core::Precision precision) {
  switch (precision) {
    case core::Precision::Bf16: return c10::ScalarType::BFloat16;
    case core::Precision::Fp16: return c10::ScalarType::Half;
    case core::Precision::Fp32: break;
  }
  return c10::ScalarType::Float;
}

AutocastGuard::AutocastGuard(core::Precision precision, c10::DeviceType device)
    : active_(precision != core::Precision::Fp32), device_(device) {
  if (!active_) return;
  checkAutocastSupported(precision, device);
  const c10::ScalarType dtype = autocastDtype(precision);
  if (device_ == c10::DeviceType::CPU) {
    previousEnabled_ = at::autocast::is_cpu_enabled();
    previousDtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(true);
  } else {
    previousEnabled_ = at::autocast::is_enabled();
    previousDtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
  }
  previousCache_ = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(true);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  at::autocast::decrement_nesting();
  at::autocast::clear_cache();  // Note [Autocast cache]: always, not only at nesting level 0
  if (device_ == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(previousEnabled_);
    at::autocast::set_autocast_cpu_dtype(previousDtype_);
  } else {
    at::autocast::set_enabled(previousEnabled_);
    at::autocast::set_autocast_gpu_dtype(previousDtype_);
  }
  at::autocast::set_autocast_cache_enabled(previousCache_);
}

}  // namespace autostage::torchscript
