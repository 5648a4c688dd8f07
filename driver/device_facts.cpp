// DeviceFacts of this process (placement.h): the one place that asks torch about GPUs.
#include <torch/cuda.h>

#include "autostage/build_config.h"
#include "driver/placement.h"

namespace autostage::driver {

DeviceFacts DeviceFacts::ofThisProcess() {
  DeviceFacts facts;
  facts.cudaBuilt = AUTOSTAGE_WITH_NCCL;  // set by AUTOSTAGE_WITH_CUDA, with the CUDA profiler
  facts.gpuCount = static_cast<int>(torch::cuda::device_count());
  return facts;
}

}  // namespace autostage::driver
