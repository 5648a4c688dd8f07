// Note [CUDA tensors over MPI]: the host staging the MPI backend puts around every tensor. A
// machine without a GPU has no CUDA tensor to stage, so the staging itself is tested through
// HostStaging::copyOf (what `of` does for a non-CPU tensor) on CPU tensors, and the decision
// through a meta tensor (not on the CPU, like a CUDA one).
#include "comm/host_staging.h"

#include <ATen/ATen.h>

#include "catch_torch.h"

using namespace autostage::comm;

TEST_CASE("host staging: CPU tensors go as they are, other devices are staged", "[comm]") {
  at::Tensor cpu = at::arange(6, at::kFloat);
  CHECK_FALSE(needsHostStaging(cpu));
  CHECK(needsHostStaging(at::empty({2}, at::TensorOptions().device(at::kMeta))));
  for (HostUse use : {HostUse::Read, HostUse::Write, HostUse::ReadWrite}) {
    HostStaging staging = HostStaging::of(cpu, use);
    CHECK(staging.host().is_same(cpu));  // zero-copy: MPI reads and writes the caller's storage
    staging.finish();
    CHECK(at::equal(cpu, at::arange(6, at::kFloat)));
  }
}

TEST_CASE("host staging: a send reads a host copy that outlives changes to the tensor",
          "[comm]") {
  at::Tensor device = at::arange(6, at::kHalf).reshape({2, 3});
  HostStaging staging = HostStaging::copyOf(device, HostUse::Read);
  const at::Tensor& host = staging.host();
  REQUIRE(host.device().is_cpu());
  CHECK(host.data_ptr() != device.data_ptr());
  CHECK(host.scalar_type() == at::kHalf);
  CHECK(host.sizes() == device.sizes());
  CHECK(host.is_contiguous());
  CHECK(at::equal(host, device));
  device.fill_(7);  // the caller reuses its tensor while the send is pending
  CHECK(at::equal(host, at::arange(6, at::kHalf).reshape({2, 3})));
  staging.finish();  // a read copies nothing back
  CHECK(at::equal(device, at::full({2, 3}, 7, at::kHalf)));
}

TEST_CASE("host staging: a receive lands on the host and is copied back once, on finish",
          "[comm]") {
  at::Tensor buffer = at::zeros({4, 3}, at::kLong);
  at::Tensor slice = buffer.narrow(0, 1, 2);  // receives write batch slices of larger buffers
  HostStaging staging = HostStaging::copyOf(slice, HostUse::Write);
  REQUIRE(staging.host().device().is_cpu());
  CHECK(staging.host().data_ptr() != slice.data_ptr());
  CHECK(staging.host().sizes() == slice.sizes());
  staging.host().fill_(5);  // what MPI wrote
  CHECK(buffer.sum().item<int64_t>() == 0);  // nothing reaches the tensor before completion
  staging.finish();
  CHECK(at::equal(slice, at::full({2, 3}, 5, at::kLong)));
  CHECK(buffer.sum().item<int64_t>() == 30);  // only the slice's rows
  staging.host().fill_(9);
  staging.finish();  // once only
  CHECK(buffer.sum().item<int64_t>() == 30);
}

TEST_CASE("host staging: an in-place collective reads the tensor and writes the result back",
          "[comm]") {
  at::Tensor device = at::tensor({1.0, 2.0, 3.0}, at::kDouble);
  HostStaging staging = HostStaging::copyOf(device, HostUse::ReadWrite);
  CHECK(at::equal(staging.host(), device));
  staging.host().mul_(2);  // the reduction
  CHECK(device[2].item<double>() == 3.0);
  staging.finish();
  CHECK(at::equal(device, at::tensor({2.0, 4.0, 6.0}, at::kDouble)));
}
