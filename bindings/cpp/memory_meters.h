#pragma once
// The memory meter a module measures its steps with (Note [Measured memory] in
// staging/memory_meter.h), built on the profiler's measurement backends.

#include <memory>

#include "staging/memory_meter.h"

namespace autostage {

// The meter for this process's stages: the counting CPU allocator (installed on first use).
std::shared_ptr<staging::MemoryMeter> cpuMemoryMeter();

}  // namespace autostage
