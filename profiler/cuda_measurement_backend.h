#pragma once
// CUDA measurement (compiled only with AUTOSTAGE_WITH_CUDA): CUDA events on the current stream
// for time, CUDACachingAllocator statistics for current and peak allocated bytes. Against a
// LibTorch without complete c10/cuda headers it falls back to cudaMemGetInfo (used device
// memory; the peak is then only the largest value seen when timed work ends: a lower bound).

#include <memory>
#include <string>

#include "profiler/measurement_backend.h"

namespace autostage::profiler {

// Throws UnsupportedError when `device` is not a visible CUDA device. `kind`: the device's kind
// as the job resolved it (driver::Device::kindText, Note [One device]); empty: "cuda:" and the
// name CUDA gives (tests, benches).
std::unique_ptr<MeasurementBackend> createCudaMeasurementBackend(int device = 0,
                                                                 const std::string& kind = "");

}  // namespace autostage::profiler
