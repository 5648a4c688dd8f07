#include "driver/job.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace autostage::driver {

namespace {

// Ranks on one GPU when `perNode` ranks share `gpus` GPUs round robin (the busiest GPU's).
int ranksPerGpu(int perNode, int gpus) {
  return (std::max(1, perNode) + std::max(1, gpus) - 1) / std::max(1, gpus);
}

}  // namespace

int64_t JobSpec::memoryPerDevice(int perNode) const {
  if (memoryLimit > 0) return memoryLimit;
  if (placement.onCuda()) return device().memoryBytes / ranksPerGpu(perNode, gpusPerNode);
  return device().memoryBytes / std::max(1, perNode);
}

core::ClusterSpec JobSpec::cluster(int devices, int perNode) const {
  core::ClusterSpec spec;
  spec.deviceKind = device().kindText();
  spec.devices = devices;
  spec.devicesPerNode = std::clamp(perNode > 0 ? perNode : ranksPerNode, 1, std::max(devices, 1));
  spec.memoryPerDevice = memoryPerDevice(spec.devicesPerNode);
  spec.intraNodeBandwidth = bandwidth;
  spec.interNodeBandwidth = bandwidth;
  spec.latencySeconds = latency;
  spec.validate();
  return spec;
}

std::string JobSpec::toString() const {
  std::ostringstream out;
  out << worldSize << " rank(s), " << ranksPerNode << " per node, " << placement.toString() << " ("
      << placement.why << "), " << core::formatBytes(static_cast<double>(deviceMemory()))
      << " per device ("
      << (memoryLimit > 0 ? std::string("mem_limit_gb")
          : placement.onCuda()
              ? "the GPU's " + core::formatBytes(static_cast<double>(device().memoryBytes)) +
                    " over " +
                    std::to_string(ranksPerGpu(ranksPerNode, gpusPerNode)) + " rank(s)"
              : "this node's " + core::formatBytes(static_cast<double>(device().memoryBytes)) +
                    " over " +
                    std::to_string(ranksPerNode) + " rank(s)")
      << ")";
  return out.str();
}

JobSpec resolveJob(const comm::Backend& backend, const core::Config& config,
                   const DeviceFacts& facts) {
  JobSpec job;
  job.worldSize = backend.worldSize();
  job.ranksPerNode = std::clamp(backend.localSize(), 1, std::max(job.worldSize, 1));
  const std::string device = config.getString("device");
  if (backend.name() == "mpi") {
    job.placement = choosePlacement(device, config.getString("comm_backend"), facts,
                                    backend.localRank(), job.ranksPerNode);
  } else {  // the caller chose the transport
    job.placement = transportPlacement(device, backend.name(), facts, backend.localRank());
  }
  if (!job.placement.onCuda())  // Note [One device]: a CPU's memory is this node's
    job.placement.device.memoryBytes =
        static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const double limitGb = config.getFloat("mem_limit_gb");
  AUTOSTAGE_CHECK_AS(ConfigError, limitGb >= 0,
                     "mem_limit_gb must be >= 0 (0: the device's own "
                     "memory), got ",
                     limitGb);
  job.memoryLimit = static_cast<int64_t>(core::gibToBytes(limitGb));
  if (job.placement.onCuda()) {
    job.gpusPerNode = std::max(1, facts.gpuCount);
    AUTOSTAGE_CHECK_AS(ConfigError, job.device().memoryBytes > 0 || job.memoryLimit > 0,
                       "the memory of ", job.device().toString(), " is not known (the CUDA runtime did not "
                       "describe it): set mem_limit_gb to the GPU memory a rank may use");
  }
  job.bandwidth = config.getFloat("comm_bandwidth");
  job.latency = config.getFloat("comm_latency");
  return job;
}

}  // namespace autostage::driver
