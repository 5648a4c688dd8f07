#pragma once
// How the MPI backend moves tensors that MPI cannot address: through a host (CPU) copy.
//
// Note [CUDA tensors over MPI]
// MPI here moves host memory only (no CUDA-aware MPI is assumed), yet ranks sharing one GPU, and
// builds without NCCL, carry a CUDA job's tensors over MPI (Note [Device and transport] in
// driver/placement.h). So every tensor an MpiBackend operation takes goes through HostStaging:
//  - a CPU tensor is used as it is (zero-copy, exactly as before CUDA tensors were accepted);
//  - any other tensor is staged: what MPI reads (a send, a collective's input) is copied to a
//    new CPU tensor first; what MPI writes (a receive, a collective's output) lands in a new CPU
//    tensor that finish() copies back into the original once the operation completed.
// A non-blocking operation's Work owns its HostStaging: the host copy of a send stays alive
// until the send completes, and a receive copies into the CUDA tensor when its Work completes
// (wait(), or isCompleted() returning true). The copies are ordinary blocking `copy_`s on the
// current stream: the device→host copy waits for the work queued before it, so MPI sends what
// the caller's stream computed, and the host→device copy is done before finish() returns.
// Host buffers are pageable (not pinned): simple, at the cost of bandwidth; NCCL is the fast path.

#include <ATen/core/Tensor.h>

namespace autostage::comm {

// What the operation does with the tensor's data.
enum class HostUse {
  Read,      // MPI reads it (send, a collective's input): stage by copying it to the host
  Write,     // MPI writes it (recv, a collective's output): a fresh host buffer, copied back
  ReadWrite  // both (an in-place allReduce, a broadcast)
};

// True when MPI cannot address the tensor's memory directly: it is not on the CPU.
bool needsHostStaging(const at::Tensor& tensor);

class HostStaging {
 public:
  HostStaging() = default;
  // Stages `tensor` only when needsHostStaging(tensor); a CPU tensor is its own host view.
  static HostStaging of(const at::Tensor& tensor, HostUse use);
  // Always stages through a new CPU tensor (what `of` does for non-CPU tensors); public so the
  // staging itself is unit-tested on machines without a GPU.
  static HostStaging copyOf(const at::Tensor& tensor, HostUse use);

  // The CPU tensor MPI reads and writes: contiguous, same dtype and shape as the original.
  const at::Tensor& host() const { return host_; }
  // Copies the host tensor back into the original tensor when it was staged for writing; then
  // does nothing more (safe to call twice). Call once the operation has completed.
  void finish();

 private:
  at::Tensor host_;
  at::Tensor target_;  // the original, to copy back into; undefined when nothing is copied back
};

}  // namespace autostage::comm
