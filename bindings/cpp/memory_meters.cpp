#include "bindings/cpp/memory_meters.h"

#include "profiler/measurement_backend.h"

namespace autostage {
namespace {

// A profiler measurement backend's memory counters as a staging::MemoryMeter.
class MeasurementMemoryMeter final : public staging::MemoryMeter {
 public:
  MeasurementMemoryMeter(std::unique_ptr<profiler::MeasurementBackend> backend, std::string name)
      : backend_(std::move(backend)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  int64_t currentBytes() const override { return backend_->currentMemory(); }
  int64_t peakBytes() const override { return backend_->peakMemory(); }
  void resetPeak() override { backend_->resetPeakMemory(); }

 private:
  std::unique_ptr<profiler::MeasurementBackend> backend_;
  std::string name_;
};

}  // namespace

std::shared_ptr<staging::MemoryMeter> cpuMemoryMeter() {
  return std::make_shared<MeasurementMemoryMeter>(profiler::createCpuMeasurementBackend(),
                                                  "cpu allocator");
}

}  // namespace autostage
