// CUDA measurement: events bracket the work on the device's current stream, so queued kernels
// count; memory comes from the caching allocator's aggregate allocated-bytes statistics.
#include "profiler/cuda_measurement_backend.h"

#include <string>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace autostage::profiler {
namespace {

void checkCuda(cudaError_t status, const char* what) {
  AUTOSTAGE_CHECK(status == cudaSuccess, "CUDA call ", what, " failed: ",
                  cudaGetErrorString(status), "; check the device and driver");
}

const c10::cuda::CUDACachingAllocator::Stat& allocatedBytes(
    const c10::cuda::CUDACachingAllocator::DeviceStats& stats) {
  using c10::cuda::CUDACachingAllocator::StatType;
  return stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)];
}

class CudaMeasurementBackend final : public MeasurementBackend {
 public:
  explicit CudaMeasurementBackend(int device) : device_(device) {
    int count = 0;
    checkCuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    AUTOSTAGE_CHECK_AS(UnsupportedError, device >= 0 && device < count, "CUDA device ", device,
                       " requested but ", count, " devices are visible; set CUDA_VISIBLE_DEVICES");
    cudaDeviceProp props{};
    checkCuda(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties");
    kind_ = std::string("cuda:") + props.name;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    checkCuda(cudaEventCreate(&start_), "cudaEventCreate");
    checkCuda(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~CudaMeasurementBackend() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }

  std::string deviceKind() const override { return kind_; }

  double time(const std::function<void()>& work) override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    checkCuda(cudaEventRecord(start_, stream), "cudaEventRecord");
    work();
    checkCuda(cudaEventRecord(stop_, stream), "cudaEventRecord");
    checkCuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    checkCuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms / 1e3;
  }

  int64_t currentMemory() const override {
    return allocatedBytes(c10::cuda::CUDACachingAllocator::getDeviceStats(device_)).current;
  }
  int64_t peakMemory() const override {
    return allocatedBytes(c10::cuda::CUDACachingAllocator::getDeviceStats(device_)).peak;
  }
  void resetPeakMemory() override { c10::cuda::CUDACachingAllocator::resetPeakStats(device_); }

 private:
  int device_;
  std::string kind_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace

std::unique_ptr<MeasurementBackend> createCudaMeasurementBackend(int device) {
  return std::make_unique<CudaMeasurementBackend>(device);
}

}  // namespace autostage::profiler
