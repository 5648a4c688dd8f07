#include "profiler/cpu_memory_tracker.h"

#include <c10/core/CPUAllocator.h>

namespace autostage::profiler {
namespace {

// Owns the base allocator's DataPtr; destroying it frees the memory.
struct Tracked {
  c10::DataPtr original;
  int64_t bytes;
  const CpuMemoryTracker* tracker;
};

// Above the default allocator's registration priority, so ours stays installed.
constexpr uint8_t kTrackerPriority = 100;

}  // namespace

CpuMemoryTracker& CpuMemoryTracker::install() {
  static CpuMemoryTracker* tracker = [] {
    auto* t = new CpuMemoryTracker(c10::GetCPUAllocator());  // lives for the process: storages
    c10::SetCPUAllocator(t, kTrackerPriority);               // may outlive any scope
    return t;
  }();
  return *tracker;
}

void CpuMemoryTracker::add(int64_t bytes) const {
  int64_t now = current_.fetch_add(bytes) + bytes;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

c10::DataPtr CpuMemoryTracker::allocate(size_t bytes) const {
  c10::DataPtr original = base_->allocate(bytes);
  void* data = original.get();
  c10::Device device = original.device();
  auto* tracked = new Tracked{std::move(original), static_cast<int64_t>(bytes), this};
  add(tracked->bytes);
  allocations_.fetch_add(1);
  return c10::DataPtr(data, tracked, &CpuMemoryTracker::release, device);
}

void CpuMemoryTracker::release(void* context) {
  auto* tracked = static_cast<Tracked*>(context);
  tracked->tracker->current_.fetch_sub(tracked->bytes);
  delete tracked;
}

}  // namespace autostage::profiler
