#include "profiler/cpu_memory_tracker.h"

#include "catch_torch.h"

#include <torch/torch.h>

#include "profiler/measurement_backend.h"

using namespace autostage::profiler;

TEST_CASE("the counting allocator sees tensor storages come and go", "[profiler]") {
  CpuMemoryTracker& tracker = CpuMemoryTracker::install();
  REQUIRE(&tracker == &CpuMemoryTracker::install());  // idempotent
  int64_t before = tracker.currentBytes();
  int64_t allocations = tracker.allocationCount();
  tracker.resetPeak();
  {
    torch::Tensor a = torch::empty({1024, 256}, torch::kFloat32);  // 1 MiB
    REQUIRE(tracker.currentBytes() - before == 1024 * 256 * 4);
    torch::Tensor b = torch::empty({512}, torch::kFloat64);  // 4 KiB
    REQUIRE(tracker.currentBytes() - before == 1024 * 256 * 4 + 512 * 8);
    REQUIRE(tracker.allocationCount() == allocations + 2);
  }
  REQUIRE(tracker.currentBytes() == before);
  REQUIRE(tracker.peakBytes() - before == 1024 * 256 * 4 + 512 * 8);
  tracker.resetPeak();
  REQUIRE(tracker.peakBytes() == before);
}

TEST_CASE("a matmul's temporary result shows up in the peak", "[profiler]") {
  auto backend = createCpuMeasurementBackend();
  REQUIRE(backend->deviceKind() == "cpu");
  torch::Tensor x = torch::ones({256, 256});
  backend->resetPeakMemory();
  int64_t before = backend->currentMemory();
  double seconds = backend->time([&] { (void)torch::mm(x, x).sum(); });
  REQUIRE(seconds > 0);
  REQUIRE(backend->currentMemory() == before);                       // result freed
  REQUIRE(backend->peakMemory() - before >= 256 * 256 * 4);          // the 256x256 product
}
