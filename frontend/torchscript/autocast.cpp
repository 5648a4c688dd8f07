#include "frontend/torchscript/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "core/error.h"

// Note [Autocast API versions]
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define AUTOSTAGE_AUTOCAST_DEVICE_API 1
#else
#define AUTOSTAGE_AUTOCAST_DEVICE_API 0
#endif
// Note [fp16 on the CPU]
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define AUTOSTAGE_CPU_FP16_AUTOCAST 1
#else
#define AUTOSTAGE_CPU_FP16_AUTOCAST 0
#endif

namespace autostage::torchscript {
namespace {

// `device`, checked to be one autostage runs autocast on (CPU or CUDA).
c10::DeviceType checked(c10::DeviceType device) {
  AUTOSTAGE_INTERNAL_ASSERT(device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA,
                            "autocast state asked for device type ", c10::DeviceTypeName(device));
  return device;
}

constexpr c10::DeviceType kCpu = c10::DeviceType::CPU;

}  // namespace

#if AUTOSTAGE_AUTOCAST_DEVICE_API
bool isAutocastEnabled(c10::DeviceType device) {
  return at::autocast::is_autocast_enabled(checked(device));
}
void setAutocastEnabled(c10::DeviceType device, bool enabled) {
  at::autocast::set_autocast_enabled(checked(device), enabled);
}
c10::ScalarType currentAutocastDtype(c10::DeviceType device) {
  return at::autocast::get_autocast_dtype(checked(device));
}
void setAutocastDtype(c10::DeviceType device, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(checked(device), dtype);
}
#else
bool isAutocastEnabled(c10::DeviceType device) {
  return checked(device) == kCpu ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
void setAutocastEnabled(c10::DeviceType device, bool enabled) {
  if (checked(device) == kCpu) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
}
c10::ScalarType currentAutocastDtype(c10::DeviceType device) {
  return checked(device) == kCpu ? at::autocast::get_autocast_cpu_dtype()
                                 : at::autocast::get_autocast_gpu_dtype();
}
void setAutocastDtype(c10::DeviceType device, c10::ScalarType dtype) {
  if (checked(device) == kCpu) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
}
#endif

void clearAutocastCacheIfEnabled() {
  if (isAutocastEnabled(c10::DeviceType::CPU) || isAutocastEnabled(c10::DeviceType::CUDA))
    at::autocast::clear_cache();
}

bool cpuAutocastSupportsFp16() { return AUTOSTAGE_CPU_FP16_AUTOCAST != 0; }

void checkAutocastSupported(core::Precision precision, c10::DeviceType device) {
  AUTOSTAGE_CHECK_AS(UnsupportedError,
                     !(precision == core::Precision::Fp16 && device == c10::DeviceType::CPU &&
                       !cpuAutocastSupportsFp16()),
                     "precision=fp16 is not supported on the CPU (device=cpu) by this build: CPU "
                     "autocast in LibTorch ",
                     TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
                     " runs bfloat16 only (fp16 from LibTorch 2.5); use precision=bf16 on the "
                     "CPU, fp16 on a GPU (device=cuda), or a build against LibTorch 2.5 or later");
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
  previousEnabled_ = isAutocastEnabled(device_);
  previousDtype_ = currentAutocastDtype(device_);
  setAutocastDtype(device_, autocastDtype(precision));
  setAutocastEnabled(device_, true);
  previousCache_ = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(true);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  at::autocast::decrement_nesting();
  at::autocast::clear_cache();  // Note [Autocast cache]: always, not only at nesting level 0
  setAutocastEnabled(device_, previousEnabled_);
  setAutocastDtype(device_, previousDtype_);
  at::autocast::set_autocast_cache_enabled(previousCache_);
}

}  // namespace autostage::torchscript
