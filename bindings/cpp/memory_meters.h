#pragma once
// The memory meter a module measures its steps with (Note [Measured memory] in
// staging/memory_meter.h), built on the profiler's measurement backends.

#include <memory>

#include "driver/placement.h"
#include "profiler/measurement_backend.h"
#include "staging/memory_meter.h"

namespace autostage {

// A profiler measurement backend's memory counters as a meter named "<device kind> allocator":
// the counting CPU allocator, or on a CUDA build profiler::createCudaMeasurementBackend(device)
// (the caching allocator's current and peak bytes).
std::shared_ptr<staging::MemoryMeter> memoryMeterOf(
    std::unique_ptr<profiler::MeasurementBackend> backend);

// The meter for CPU stages: the counting CPU allocator (installed on first use).
std::shared_ptr<staging::MemoryMeter> cpuMemoryMeter();

// The meter of a job's device: cpuMemoryMeter() on the CPU, the caching allocator of the rank's
// GPU for a CUDA job (profiler::createMeasurementBackend).
std::shared_ptr<staging::MemoryMeter> memoryMeterFor(const driver::Placement& placement);

}  // namespace autostage
