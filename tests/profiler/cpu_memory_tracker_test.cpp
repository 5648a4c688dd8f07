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

// Note [c10::Allocator across LibTorch versions]: the adapter builds against LibTorch 2.x's
// interface too (allocate() not const, copy_data() pure virtual), checked here on any LibTorch
// with a stand-in base class of that shape, and against the old one (allocate() const, no
// copy_data()).
namespace {

namespace adapter = autostage::profiler::detail;

struct Allocator2x {
  virtual ~Allocator2x() = default;
  virtual c10::DataPtr allocate(size_t bytes) = 0;
  virtual void copy_data(void* dest, const void* src, std::size_t count) const = 0;
};

struct Allocator1x {
  virtual ~Allocator1x() = default;
  virtual c10::DataPtr allocate(size_t bytes) const = 0;
};

template <typename Base>
class CountingAllocator final : public adapter::AllocatorAdapter<Base> {
 public:
  mutable size_t requested = 0;

 protected:
  c10::DataPtr allocateTracked(size_t bytes) const override {
    requested += bytes;
    return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
  }
};

static_assert(!adapter::kConstAllocate<Allocator2x> && adapter::HasCopyData<Allocator2x>::value);
static_assert(adapter::kConstAllocate<Allocator1x> && !adapter::HasCopyData<Allocator1x>::value);

}  // namespace

TEST_CASE("the allocator adapter implements the 1.13 and the 2.x c10::Allocator interface",
          "[profiler]") {
  CountingAllocator<Allocator2x> newer;
  Allocator2x& newerBase = newer;
  (void)newerBase.allocate(16);
  CHECK(newer.requested == 16);
  char source[] = "abc";
  char copy[sizeof(source)] = {};
  newerBase.copy_data(copy, source, sizeof(source));
  CHECK(std::string(copy) == "abc");

  CountingAllocator<Allocator1x> older;
  const Allocator1x& olderBase = older;
  (void)olderBase.allocate(8);
  CHECK(older.requested == 8);
}
