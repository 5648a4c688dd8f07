// createMeasurementBackend: the job's device to its measurement backend.
#include "profiler/measurement_backend.h"

#include <algorithm>

#include "autostage/build_config.h"
#include "core/error.h"
#if AUTOSTAGE_WITH_NCCL  // set with AUTOSTAGE_WITH_CUDA: the CUDA profiler is built
#include "profiler/cuda_measurement_backend.h"
#endif

namespace autostage::profiler {

std::unique_ptr<MeasurementBackend> createMeasurementBackend(int cudaIndex,
                                                             const std::string& deviceKind) {
  if (cudaIndex < 0) return createCpuMeasurementBackend();
  const int index = cudaIndex;
#if AUTOSTAGE_WITH_NCCL
  return createCudaMeasurementBackend(index, deviceKind);
#else
  (void)deviceKind;
  AUTOSTAGE_CHECK_AS(UnsupportedError, false, "profiling on cuda:", index,
                     " needs a build with CUDA: configure with -DAUTOSTAGE_WITH_CUDA=ON against "
                     "a LibTorch with CUDA (scripts/test-gpu does), or use device=cpu");
  return nullptr;
#endif
}

double median(std::vector<double> values) {
  AUTOSTAGE_INTERNAL_ASSERT(!values.empty());
  size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  double upper = values[mid];
  if (values.size() % 2) return upper;
  return (upper + *std::max_element(values.begin(), values.begin() + mid)) / 2;
}

}  // namespace autostage::profiler
