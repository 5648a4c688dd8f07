#include "profiler/cpu_memory_tracker.h"

#include <mutex>
#include <unordered_map>

#include <c10/core/CPUAllocator.h>

namespace autostage::profiler {
namespace {

// Owns the base allocator's DataPtr; destroying it frees the memory.
struct Tracked {
  c10::DataPtr original;
  int64_t bytes;
};

// Live allocations by data pointer. The DataPtrs we hand out carry the data pointer itself as
// context (some kernels use raw_allocate, which requires context == data), so the deleter finds
// its record here.
std::mutex gMutex;
std::unordered_map<void*, Tracked>& liveAllocations() {
  static auto* live = new std::unordered_map<void*, Tracked>();  // outlives static storages
  return *live;
}

// Above the default allocator's registration priority, so ours stays installed.
constexpr uint8_t kTrackerPriority = 100;

CpuMemoryTracker* gTracker = nullptr;

}  // namespace

CpuMemoryTracker& CpuMemoryTracker::install() {
  static CpuMemoryTracker* tracker = [] {
    auto* t = new CpuMemoryTracker(c10::GetCPUAllocator());  // lives for the process: storages
    gTracker = t;                                            // may outlive any scope
    c10::SetCPUAllocator(t, kTrackerPriority);
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
  if (data == nullptr) return original;  // zero bytes: nothing to count
  c10::Device device = original.device();
  {
    std::lock_guard<std::mutex> lock(gMutex);
    liveAllocations()[data] = Tracked{std::move(original), static_cast<int64_t>(bytes)};
  }
  add(static_cast<int64_t>(bytes));
  allocations_.fetch_add(1);
  return c10::DataPtr(data, data, &CpuMemoryTracker::release, device);
}

void CpuMemoryTracker::release(void* data) {
  Tracked tracked;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    auto it = liveAllocations().find(data);
    if (it == liveAllocations().end()) return;
    tracked = std::move(it->second);
    liveAllocations().erase(it);
  }
  gTracker->current_.fetch_sub(tracked.bytes);
  // `tracked.original` frees the memory when it goes out of scope, outside the lock.
}

}  // namespace autostage::profiler
