#include "profiler/cpu_memory_tracker.h"

#include <mutex>
#include <unordered_map>
#include <vector>

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

// Note [Measurement allocation cache]: freed blocks by size, guarded by gMutex.
int gCacheUsers = 0;
int64_t gCachedBytes = 0;
std::unordered_map<size_t, std::vector<c10::DataPtr>>& cache() {
  static auto* blocks = new std::unordered_map<size_t, std::vector<c10::DataPtr>>();
  return *blocks;
}

// A cached block of exactly `bytes`, or an empty DataPtr. Caller holds gMutex.
c10::DataPtr takeCached(size_t bytes) {
  if (gCacheUsers == 0 || bytes < CpuMemoryTracker::kCacheMinBytes) return {};
  auto it = cache().find(bytes);
  if (it == cache().end() || it->second.empty()) return {};
  c10::DataPtr block = std::move(it->second.back());
  it->second.pop_back();
  gCachedBytes -= static_cast<int64_t>(bytes);
  return block;
}

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

c10::DataPtr CpuMemoryTracker::allocateTracked(size_t bytes) const {
  c10::DataPtr original;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    original = takeCached(bytes);
  }
  if (!original) original = base_->allocate(bytes);
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
  std::unordered_map<size_t, std::vector<c10::DataPtr>> evicted;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(gMutex);
    auto it = liveAllocations().find(data);
    if (it == liveAllocations().end()) return;
    tracked = std::move(it->second);
    liveAllocations().erase(it);
    auto size = static_cast<size_t>(tracked.bytes);
    if (gCacheUsers > 0 && size >= kCacheMinBytes && tracked.bytes <= kCacheMaxBytes) {
      if (gCachedBytes + tracked.bytes > kCacheMaxBytes) {  // full: start over (sizes change
        evicted.swap(cache());                              // with the batch size)
        gCachedBytes = 0;
      }
      cache()[size].push_back(std::move(tracked.original));
      gCachedBytes += tracked.bytes;
    }
  }
  gTracker->current_.fetch_sub(tracked.bytes);
  // `tracked.original` frees the memory when it goes out of scope, outside the lock.
}

void CpuMemoryTracker::enableCache() {
  std::lock_guard<std::mutex> lock(gMutex);
  ++gCacheUsers;
}

void CpuMemoryTracker::disableCache() {
  std::unordered_map<size_t, std::vector<c10::DataPtr>> freed;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    if (gCacheUsers > 0 && --gCacheUsers == 0) {
      freed.swap(cache());
      gCachedBytes = 0;
    }
  }
  // `freed` releases the blocks here, outside the lock.
}

int64_t CpuMemoryTracker::cachedBytes() const {
  std::lock_guard<std::mutex> lock(gMutex);
  return gCachedBytes;
}

}  // namespace autostage::profiler
