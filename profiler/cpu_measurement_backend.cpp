// CPU measurement: steady-clock wall time and the counting CPU allocator.
#include <chrono>

#include "profiler/cpu_memory_tracker.h"
#include "profiler/measurement_backend.h"

namespace autostage::profiler {
namespace {

class CpuMeasurementBackend final : public MeasurementBackend {
 public:
  CpuMeasurementBackend() : tracker_(CpuMemoryTracker::install()) {}
  std::string deviceKind() const override { return "cpu"; }
  double time(const std::function<void()>& work) override {
    auto start = std::chrono::steady_clock::now();
    work();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  int64_t currentMemory() const override { return tracker_.currentBytes(); }
  int64_t peakMemory() const override { return tracker_.peakBytes(); }
  void resetPeakMemory() override { tracker_.resetPeak(); }

 private:
  CpuMemoryTracker& tracker_;
};

}  // namespace

std::unique_ptr<MeasurementBackend> createCpuMeasurementBackend() {
  return std::make_unique<CpuMeasurementBackend>();
}

}  // namespace autostage::profiler
