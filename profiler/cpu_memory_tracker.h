#pragma once
// Counts CPU tensor memory: a wrapper around LibTorch's CPU allocator, installed once per process
// with c10::SetCPUAllocator, that keeps current and peak bytes of the storages allocated through it.
//
// Contract: install() is idempotent and thread-safe; allocations made before install() are not
// counted (their frees are not either). Counters are process-wide (all threads) and count the
// bytes of live storages only, never the cache below.
//
// Note [Measurement allocation cache]
// glibc serves large blocks with mmap (or trims the heap top on free), so every training step
// of a big node pays page faults for fresh zeroed pages: that doubled the measured time of a
// 9 MB-weight convolution, and by how much depended on what ran before (the heap's state), so
// nodes measured alone and the same nodes measured as one block disagreed by 40%. While
// caching is on, freed blocks of at least kCacheMinBytes are kept by exact size and handed out
// again (steady-state reuse, as a training loop sees it), up to kCacheMaxBytes in total (when full, the cache is emptied and starts over).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <c10/core/Allocator.h>

namespace autostage::profiler {
namespace detail {

// Note [c10::Allocator across LibTorch versions]
// LibTorch 1.13 declares `DataPtr allocate(size_t) const`; LibTorch 2.x declares it without
// `const` and adds a pure virtual `copy_data(void*, const void*, size_t) const` (used to clone
// storages). AllocatorAdapter<Base> implements whichever interface Base declares -- detected
// from the member function types rather than from a version number, so every release between
// the two builds as well -- and forwards allocation to allocateTracked(). Instantiating it with
// a stand-in Base that has the 2.x interface (tests/profiler/cpu_memory_tracker_test.cpp)
// checks the 2.x side on a 1.13 build.
template <typename Base>
inline constexpr bool kConstAllocate =
    std::is_same_v<decltype(&Base::allocate), c10::DataPtr (Base::*)(size_t) const>;

template <typename Base, typename = void>
struct HasCopyData : std::false_type {};
template <typename Base>
struct HasCopyData<Base, std::void_t<decltype(&Base::copy_data)>> : std::true_type {};

// copy_data, where Base declares it: host memory, so a plain copy.
template <typename Base, bool = HasCopyData<Base>::value>
class WithCopyData : public Base {};
template <typename Base>
class WithCopyData<Base, true> : public Base {
 public:
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }
};

template <typename Base, bool = kConstAllocate<Base>>
class AllocatorAdapter : public WithCopyData<Base> {  // 1.13: allocate() const
 public:
  c10::DataPtr allocate(size_t bytes) const override { return allocateTracked(bytes); }

 protected:
  virtual c10::DataPtr allocateTracked(size_t bytes) const = 0;
};
template <typename Base>
class AllocatorAdapter<Base, false> : public WithCopyData<Base> {  // 2.x: allocate() non-const
 public:
  c10::DataPtr allocate(size_t bytes) override { return allocateTracked(bytes); }

 protected:
  virtual c10::DataPtr allocateTracked(size_t bytes) const = 0;
};

}  // namespace detail

class CpuMemoryTracker final : public detail::AllocatorAdapter<c10::Allocator> {
 public:
  // The process-wide tracker, installed as the CPU allocator on first call.
  static CpuMemoryTracker& install();

  int64_t currentBytes() const { return current_.load(); }
  int64_t peakBytes() const { return peak_.load(); }
  // Starts a new peak window at the current usage.
  void resetPeak() { peak_.store(current_.load()); }
  // Number of allocations served (to assert that something was measured).
  int64_t allocationCount() const { return allocations_.load(); }
  // Turns Note [Measurement allocation cache] on or off; nested: on while any enabler is
  // active. Turning the last one off frees the cached blocks.
  void enableCache();
  void disableCache();
  // Bytes currently held in the cache (not counted as current or peak).
  int64_t cachedBytes() const;

  static constexpr size_t kCacheMinBytes = 64 << 10;
  static constexpr int64_t kCacheMaxBytes = int64_t{1} << 30;

  // Every non-empty DataPtr we return has this deleter and context == data, so kernels that
  // use raw_allocate/raw_deallocate work with the tracker installed.
  c10::DeleterFnPtr raw_deleter() const override { return &CpuMemoryTracker::release; }

 protected:
  // allocate() on every LibTorch version (Note [c10::Allocator across LibTorch versions]).
  c10::DataPtr allocateTracked(size_t bytes) const override;

 private:
  explicit CpuMemoryTracker(c10::Allocator* base) : base_(base) {}
  static void release(void* context);
  void add(int64_t bytes) const;

  c10::Allocator* base_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
  mutable std::atomic<int64_t> allocations_{0};
};

}  // namespace autostage::profiler
