#pragma once
// How the profiler measures time and memory on one kind of device. Torch-free interface:
// CPU (wall clock + counting CPU allocator) and CUDA (events + device allocator statistics,
// compiled only with AUTOSTAGE_WITH_CUDA).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace autostage::profiler {

class MeasurementBackend {
 public:
  virtual ~MeasurementBackend() = default;
  // e.g. "cpu", "cuda:0"; part of the profile cache key.
  virtual std::string deviceKind() const = 0;
  // Runs `work` once and returns its duration in seconds, including device work it queued.
  virtual double time(const std::function<void()>& work) = 0;
  // Memory of tensors on this device, in bytes.
  virtual int64_t currentMemory() const = 0;
  virtual int64_t peakMemory() const = 0;
  // Starts a new peak window at the current usage.
  virtual void resetPeakMemory() = 0;
};

// How the CPU backend times work. Wall: steady clock. ProcessCpu: CPU time of this process
// (all its threads): immune to other jobs sharing the cores, equal to wall time for
// single-threaded work on an idle core; use it with one intra-op thread on a loaded machine.
enum class CpuClock { Wall, ProcessCpu };

std::unique_ptr<MeasurementBackend> createCpuMeasurementBackend(CpuClock clock = CpuClock::Wall);

}  // namespace autostage::profiler
