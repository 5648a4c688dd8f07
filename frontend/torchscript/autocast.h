#pragma once
// torch.autocast for the exported stage functions: an RAII guard that turns autocast on for one
// device at a precision (core/precision.h) and restores the previous state, like Python's
// `with torch.autocast(device, dtype=...)`.
//
// Note [Autocast execution]
// Stages, the importer's probe run and the profiler run the exported TorchScript graphs with the
// simple executor, which applies no JIT autocast pass: every op dispatches through the
// AutocastCPU (AutocastCUDA) key at run time, exactly as eager code inside torch.autocast does.
// Parameters are fed as the fp32 master weights; matmul/conv-like ops cast them (and their other
// inputs) to the low precision, so tensors downstream of them are bf16/fp16 wherever autocast
// would produce them in plain PyTorch; their gradients flow back to the fp32 weights. The
// importer's probe runs under the same guard, so the IR records the dtypes the stages will
// produce (and routes allocate and send those: a bf16 boundary travels in half the bytes).
//
// Note [Autocast cache]
// Autocast caches the low-precision copy of each leaf weight it casts until the outermost
// autocast region ends. The guard clears that cache whenever it ends (even when nested inside a
// caller's autocast region): a copy cast under no_grad has no autograd history and, reused by a
// later run with autograd (a recompute stage's re-run), would silently cut the weights'
// gradients (checked on LibTorch 1.13); and the optimizer updates the weights in place between
// steps, which the cache, keyed by tensor, would not notice.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include "core/precision.h"

namespace autostage::torchscript {

// Note [fp16 on the CPU]
// CPU autocast runs float16 from LibTorch 2.5 (bfloat16 only before: LibTorch 1.13 refuses the
// dtype), with the CPU's own lists of ops cast down and kept in fp32. A build against 2.5 or
// later therefore runs precision=fp16 on the CPU as on a GPU, dynamic loss scaling included
// (Note [Dynamic loss scaling]): the CPU-tested path of the CUDA fp16 one. Older builds refuse it.
bool cpuAutocastSupportsFp16();

// Throws UnsupportedError when autocast cannot run `precision` on `device` (fp16 on the CPU of a
// build without it: Note [fp16 on the CPU]).
void checkAutocastSupported(core::Precision precision, c10::DeviceType device);

// The low-precision dtype autocast uses (Float for fp32).
c10::ScalarType autocastDtype(core::Precision precision);

// Note [Autocast API versions]
// LibTorch 2.4 replaced the per-device autocast state calls (at::autocast::is_cpu_enabled,
// set_autocast_gpu_dtype, ...) with device-type-generic ones (is_autocast_enabled(device), ...)
// and deprecated the old ones (a compiler warning per call, a printed warning per run). The
// functions below are the only place autostage reads or sets that state; they call whichever API
// the LibTorch being built against has (TORCH_VERSION_* from <torch/version.h>). `device` is CPU
// or CUDA (GPU); another device type is an internal error.
bool isAutocastEnabled(c10::DeviceType device);
void setAutocastEnabled(c10::DeviceType device, bool enabled);
c10::ScalarType currentAutocastDtype(c10::DeviceType device);
void setAutocastDtype(c10::DeviceType device, c10::ScalarType dtype);
// Clears autocast's cast cache if autocast is on for the CPU or CUDA (Note [Autocast cache]).
void clearAutocastCacheIfEnabled();

class AutocastGuard {
 public:
  // fp32: does nothing. Otherwise enables autocast for `device` with the precision's dtype.
  AutocastGuard(core::Precision precision, c10::DeviceType device);
  // Restores the previous autocast state and clears the cast cache (Note [Autocast cache]).
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_;
  bool previousEnabled_ = false;
  bool previousCache_ = true;
  c10::ScalarType previousDtype_ = c10::ScalarType::BFloat16;
};

}  // namespace autostage::torchscript
