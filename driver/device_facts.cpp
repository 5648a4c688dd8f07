// DeviceFacts of this process (placement.h): the one place that asks torch about GPUs.
#include <torch/cuda.h>

#include "autostage/build_config.h"
#include "driver/placement.h"
#if AUTOSTAGE_WITH_NCCL
#include <cuda_runtime_api.h>
#endif

namespace autostage::driver {

DeviceFacts DeviceFacts::ofThisProcess() {
  DeviceFacts facts;
  facts.cudaBuilt = AUTOSTAGE_WITH_NCCL;  // set by AUTOSTAGE_WITH_CUDA, with the CUDA profiler
  facts.gpuCount = static_cast<int>(torch::cuda::device_count());
#if AUTOSTAGE_WITH_NCCL
  for (int d = 0; d < facts.gpuCount; ++d) {
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, d) != cudaSuccess) {
      facts.gpus.clear();  // unknown: resolveJob then asks for mem_limit_gb
      break;
    }
    facts.gpus.push_back({props.name, static_cast<int64_t>(props.totalGlobalMem)});
  }
#endif
  return facts;
}

}  // namespace autostage::driver
