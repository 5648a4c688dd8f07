// CPU measurement: steady-clock wall time (or process CPU time) and the counting CPU allocator.
#include <chrono>
#include <ctime>

#include "profiler/cpu_memory_tracker.h"
#include "profiler/measurement_backend.h"

namespace autostage::profiler {
namespace {

class CpuMeasurementBackend final : public MeasurementBackend {
 public:
  explicit CpuMeasurementBackend(CpuClock clock)
      : tracker_(CpuMemoryTracker::install()), clock_(clock) {
    tracker_.enableCache();  // Note [Measurement allocation cache]
  }
  ~CpuMeasurementBackend() override { tracker_.disableCache(); }
  std::string deviceKind() const override { return "cpu"; }
  std::string device() const override { return "cpu"; }
  double time(const std::function<void()>& work) override {
    double start = now();
    work();
    return now() - start;
  }
  int64_t currentMemory() const override { return tracker_.currentBytes(); }
  int64_t peakMemory() const override { return tracker_.peakBytes(); }
  void resetPeakMemory() override { tracker_.resetPeak(); }

 private:
  double now() const {
    if (clock_ == CpuClock::Wall)
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }

  CpuMemoryTracker& tracker_;
  CpuClock clock_;
};

}  // namespace

std::unique_ptr<MeasurementBackend> createCpuMeasurementBackend(CpuClock clock) {
  return std::make_unique<CpuMeasurementBackend>(clock);
}

}  // namespace autostage::profiler
