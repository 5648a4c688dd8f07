#pragma once
// How the profiler measures time and memory on one kind of device. Torch-free interface:
// CPU (wall clock + counting CPU allocator) and CUDA (events + device allocator statistics,
// compiled only with AUTOSTAGE_WITH_CUDA).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace autostage::profiler {

class MeasurementBackend {
 public:
  virtual ~MeasurementBackend() = default;
  // The device model, part of the profile cache key: "cpu", "cuda:NVIDIA H100 80GB HBM3".
  virtual std::string deviceKind() const = 0;
  // The torch device its work runs on ("cpu", "cuda:1"): where reference work (the load probe)
  // allocates its tensors.
  virtual std::string device() const = 0;
  // Runs `work` once and returns its duration in seconds, including device work it queued.
  virtual double time(const std::function<void()>& work) = 0;
  // Memory of tensors on this device, in bytes.
  virtual int64_t currentMemory() const = 0;
  virtual int64_t peakMemory() const = 0;
  // Starts a new peak window at the current usage.
  virtual void resetPeakMemory() = 0;
  // Untimed forward+backward runs of each node before its memory run (Note [Settling runs] in
  // profiler/node_runner.cpp): 0 on the CPU, 1 on CUDA.
  virtual int settlingRuns() const { return 0; }
};

// How the CPU backend times work. Wall: steady clock. ProcessCpu: CPU time of this process
// (all its threads): immune to other jobs sharing the cores, equal to wall time for
// single-threaded work on an idle core; use it with one intra-op thread on a loaded machine.
enum class CpuClock { Wall, ProcessCpu };

std::unique_ptr<MeasurementBackend> createCpuMeasurementBackend(CpuClock clock = CpuClock::Wall);

// The backend of a job's device: the CPU (wall clock) for cudaIndex < 0, else CUDA device
// cudaIndex (the rank's GPU; driver::Placement::cudaIndex). Throws UnsupportedError for CUDA in
// a build without -DAUTOSTAGE_WITH_CUDA=ON (or for a GPU that is not visible). deviceKind: the
// device's kind as the job resolved it (driver::Device::kindText, Note [One device]), so the
// profile is keyed by the same text as the job's plans; empty: the backend's own.
std::unique_ptr<MeasurementBackend> createMeasurementBackend(int cudaIndex,
                                                             const std::string& deviceKind = "");

// Median of a non-empty sample (the profiler's timings, the comm profile's).
double median(std::vector<double> values);

}  // namespace autostage::profiler
