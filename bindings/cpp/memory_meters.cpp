#include "bindings/cpp/memory_meters.h"

#include <algorithm>

namespace autostage {
namespace {

class MeasurementMemoryMeter final : public staging::MemoryMeter {
 public:
  explicit MeasurementMemoryMeter(std::unique_ptr<profiler::MeasurementBackend> backend)
      : backend_(std::move(backend)), name_(backend_->deviceKind() + " allocator") {}
  std::string name() const override { return name_; }
  int64_t currentBytes() const override { return backend_->currentMemory(); }
  int64_t peakBytes() const override { return backend_->peakMemory(); }
  void resetPeak() override { backend_->resetPeakMemory(); }

 private:
  std::unique_ptr<profiler::MeasurementBackend> backend_;
  std::string name_;
};

}  // namespace

std::shared_ptr<staging::MemoryMeter> memoryMeterOf(
    std::unique_ptr<profiler::MeasurementBackend> backend) {
  return std::make_shared<MeasurementMemoryMeter>(std::move(backend));
}

std::shared_ptr<staging::MemoryMeter> cpuMemoryMeter() {
  return memoryMeterOf(profiler::createCpuMeasurementBackend());
}

std::shared_ptr<staging::MemoryMeter> memoryMeterFor(const driver::Placement& placement) {
  if (!placement.onCuda()) return cpuMemoryMeter();
  return memoryMeterOf(profiler::createMeasurementBackend(placement.cudaIndex(),
                                                              placement.device.kindText()));
}

}  // namespace autostage
