// CUDA measurement: events bracket the work on the current stream, so queued kernels count.
// Memory: with a CUDA build of LibTorch, the caching allocator's aggregate allocated-bytes
// statistics (current and peak). LibTorch builds without the c10/cuda headers (Debian's CPU
// build ships them incomplete) fall back to cudaMemGetInfo: current = used device memory, peak =
// the largest value seen at time() boundaries (a lower bound; documented in the header).
#include "profiler/cuda_measurement_backend.h"

#include <algorithm>
#include <string>

#include <cuda_runtime.h>

#if __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#define AUTOSTAGE_CUDA_ALLOCATOR_STATS 1
#else
#define AUTOSTAGE_CUDA_ALLOCATOR_STATS 0
#endif

// Where the caching allocator's statistics types live: LibTorch 1.13 declares Stat/StatType in
// c10::cuda::CUDACachingAllocator; LibTorch 2.x moved them to the device-generic
// c10::CachingDeviceAllocator (c10/core/CachingDeviceAllocator.h, which 1.13 does not have).
// getDeviceStats() and resetPeakStats() stay in c10::cuda::CUDACachingAllocator on both.
#if AUTOSTAGE_CUDA_ALLOCATOR_STATS && __has_include(<c10/core/CachingDeviceAllocator.h>)
#include <c10/core/CachingDeviceAllocator.h>
#define AUTOSTAGE_DEVICE_GENERIC_STATS 1
#else
#define AUTOSTAGE_DEVICE_GENERIC_STATS 0
#endif

#include "core/error.h"

namespace autostage::profiler {
namespace {

#if AUTOSTAGE_DEVICE_GENERIC_STATS
namespace allocator_stats = c10::CachingDeviceAllocator;
#elif AUTOSTAGE_CUDA_ALLOCATOR_STATS
namespace allocator_stats = c10::cuda::CUDACachingAllocator;
#endif

void checkCuda(cudaError_t status, const char* what) {
  AUTOSTAGE_CHECK(status == cudaSuccess, "CUDA call ", what, " failed: ",
                  cudaGetErrorString(status), "; check the device and driver");
}

class CudaMeasurementBackend final : public MeasurementBackend {
 public:
  CudaMeasurementBackend(int device, const std::string& kind) : device_(device), kind_(kind) {
    int count = 0;
    checkCuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    AUTOSTAGE_CHECK_AS(UnsupportedError, device >= 0 && device < count, "CUDA device ", device,
                       " requested but ", count, " devices are visible; set CUDA_VISIBLE_DEVICES");
    if (kind_.empty()) {  // not resolved by a job
      cudaDeviceProp props{};
      checkCuda(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties");
      kind_ = std::string("cuda:") + props.name;
    }
    checkCuda(cudaSetDevice(device_), "cudaSetDevice");
    checkCuda(cudaEventCreate(&start_), "cudaEventCreate");
    checkCuda(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~CudaMeasurementBackend() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }

  std::string deviceKind() const override { return kind_; }
  std::string device() const override { return "cuda:" + std::to_string(device_); }
  int settlingRuns() const override { return 1; }

  double time(const std::function<void()>& work) override {
    checkCuda(cudaSetDevice(device_), "cudaSetDevice");
    cudaStream_t stream = currentStream();
    checkCuda(cudaEventRecord(start_, stream), "cudaEventRecord");
    work();
    checkCuda(cudaEventRecord(stop_, stream), "cudaEventRecord");
    checkCuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    observe();
    float ms = 0;
    checkCuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms / 1e3;
  }

#if AUTOSTAGE_CUDA_ALLOCATOR_STATS
  int64_t currentMemory() const override { return allocatedBytes(/*peak=*/false); }
  int64_t peakMemory() const override { return allocatedBytes(/*peak=*/true); }
  void resetPeakMemory() override {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_));
  }

 private:
  cudaStream_t currentStream() const {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
  }
  // The caching allocator's aggregate allocated bytes on our device: current or peak.
  int64_t allocatedBytes(bool peak) const {
    using allocator_stats::StatType;
    const auto stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_));
    const auto& aggregate = stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)];
    return peak ? aggregate.peak : aggregate.current;
  }
  void observe() {}
#else
  int64_t currentMemory() const override { return usedBytes(); }
  int64_t peakMemory() const override { return std::max(peak_, usedBytes()); }
  void resetPeakMemory() override { peak_ = usedBytes(); }

 private:
  cudaStream_t currentStream() const { return nullptr; }  // the legacy default stream
  int64_t usedBytes() const {
    size_t free = 0, total = 0;
    checkCuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return static_cast<int64_t>(total - free);
  }
  void observe() { peak_ = std::max(peak_, usedBytes()); }
  int64_t peak_ = 0;
#endif

  int device_;
  std::string kind_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace

std::unique_ptr<MeasurementBackend> createCudaMeasurementBackend(int device,
                                                                 const std::string& kind) {
  return std::make_unique<CudaMeasurementBackend>(device, kind);
}

}  // namespace autostage::profiler
