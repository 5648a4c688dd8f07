// Note [Recompute RNG state]: which generators a recompute stage saves, and the save/restore.
#include "staging/rng_state.h"

#include <torch/torch.h>

#include "catch_torch.h"  // after torch (NOTES-libtorch: glog's CHECK)

namespace autostage::staging {
namespace {

c10::Device cuda(int index) { return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)); }

}  // namespace

TEST_CASE("a stage saves the CPU generator and those of the CUDA devices its tensors are on",
          "[staging]") {
  const c10::Device cpu(c10::kCPU);
  CHECK(rngDevices({}) == std::vector<c10::Device>{cpu});
  CHECK(rngDevices({cpu, cpu}) == std::vector<c10::Device>{cpu});
  CHECK(rngDevices({cuda(1), cpu, cuda(0), cuda(1)}) ==
        std::vector<c10::Device>{cpu, cuda(0), cuda(1)});
  CHECK(rngDevices({cuda(2)}) == std::vector<c10::Device>{cpu, cuda(2)});  // CPU all the same
  CHECK(rngDevices({c10::Device(c10::kMeta)}) == std::vector<c10::Device>{cpu});
}

TEST_CASE("swapping generator states replays the same random numbers", "[staging]") {
  torch::manual_seed(11);
  const RngStates saved = saveRngStates(rngDevices({c10::Device(c10::kCPU)}));
  REQUIRE(saved.size() == 1);
  const torch::Tensor first = torch::rand({8});
  const torch::Tensor second = torch::rand({8});
  REQUIRE_FALSE(torch::equal(first, second));

  const RngStates current = swapRngStates(saved);  // as a recompute stage's re-run starts
  CHECK(torch::equal(torch::rand({8}), first));   // the re-run draws what the forward drew
  swapRngStates(current);                          // and leaves the generator where it was
  const torch::Tensor next = torch::rand({8});

  torch::manual_seed(11);
  (void)torch::rand({8});
  (void)torch::rand({8});
  CHECK(torch::equal(next, torch::rand({8})));  // the third draw after the seed
}

}  // namespace autostage::staging
