#include "comm/host_staging.h"

#include <ATen/ATen.h>

namespace autostage::comm {

bool needsHostStaging(const at::Tensor& tensor) { return !tensor.device().is_cpu(); }

HostStaging HostStaging::of(const at::Tensor& tensor, HostUse use) {
  if (needsHostStaging(tensor)) return copyOf(tensor, use);
  HostStaging staging;
  staging.host_ = tensor;  // zero-copy: MPI reads and writes the caller's storage
  return staging;
}

HostStaging HostStaging::copyOf(const at::Tensor& tensor, HostUse use) {
  HostStaging staging;
  const at::TensorOptions host = tensor.options().device(at::kCPU);
  staging.host_ = at::empty(tensor.sizes(), host);  // new storage, even for a CPU tensor
  if (use != HostUse::Write) staging.host_.copy_(tensor);
  if (use != HostUse::Read) staging.target_ = tensor;
  return staging;
}

// Note [CUDA tensors over MPI]: the operation has completed, so the host data is final.
void HostStaging::finish() {
  if (!target_.defined()) return;
  target_.copy_(host_);
  target_.reset();
}

}  // namespace autostage::comm
