#pragma once
// CUDA measurement (compiled only with AUTOSTAGE_WITH_CUDA): CUDA events on the current stream
// for time, CUDACachingAllocator statistics for current and peak allocated bytes. Against a
// LibTorch without complete c10/cuda headers it falls back to cudaMemGetInfo (used device
// memory; the peak is then only the largest value seen when timed work ends: a lower bound).

#include <memory>

#include "profiler/measurement_backend.h"

namespace autostage::profiler {

// Throws UnsupportedError when `device` is not a visible CUDA device.
std::unique_ptr<MeasurementBackend> createCudaMeasurementBackend(int device = 0);

}  // namespace autostage::profiler
