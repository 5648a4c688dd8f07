#include "driver/placement.h"

#include <string>

#include "autostage/build_config.h"
#include "core/error.h"

namespace autostage::driver {

const char* deviceKindName(DeviceKind kind) { return kind == DeviceKind::Cuda ? "cuda" : "cpu"; }

std::string Device::kindText() const {
  if (!onCuda()) return "cpu";
  return model.empty() ? "cuda" : "cuda:" + model;
}

std::string Device::toString() const {
  const std::string name = deviceKindName(kind);
  return index >= 0 ? name + ":" + std::to_string(index) : name;
}

std::string Placement::toString() const { return device.toString() + " over " + commBackend; }

namespace {

// Note [One device]: a GPU of this process, as CUDA described it.
Device cudaDevice(const DeviceFacts& facts, int localRank) {
  Device d;
  d.kind = DeviceKind::Cuda;
  d.index = facts.gpuCount > 0 ? localRank % facts.gpuCount : -1;
  if (d.index >= 0 && d.index < static_cast<int>(facts.gpus.size())) {
    d.model = facts.gpus[d.index].name;
    d.memoryBytes = facts.gpus[d.index].totalBytes;
  }
  return d;
}

}  // namespace

Placement transportPlacement(const std::string& device, const std::string& transport,
                             const DeviceFacts& facts, int localRank) {
  const bool cuda = transport == "nccl";
  AUTOSTAGE_CHECK_AS(ConfigError, device == "auto" || device == (cuda ? "cuda" : "cpu"),
                     "device=", device, ", but the transport given (", transport,
                     ") carries ", cuda ? "CUDA" : "CPU", " tensors: use device=auto");
  Placement p;
  if (cuda) p.device = cudaDevice(facts, localRank);
  p.commBackend = transport;
  p.why = "the transport the caller gave";
  return p;
}

Placement choosePlacement(const std::string& device, const std::string& commBackend,
                          const DeviceFacts& facts, int localRank, int ranksPerNode) {
  AUTOSTAGE_CHECK_AS(ConfigError, device == "auto" || device == "cpu" || device == "cuda",
                     "device=", device, " is not a device: use auto, cpu or cuda");
  AUTOSTAGE_CHECK_AS(ConfigError,
                     commBackend == "auto" || commBackend == "mpi" || commBackend == "nccl",
                     "comm_backend=", commBackend, " is not a transport: use auto, mpi or nccl");
  Placement p;
  if (device == "cuda") {
    AUTOSTAGE_CHECK_AS(ConfigError, facts.cudaBuilt,
                       "device=cuda, but this build of autostage "
                       "has no CUDA (it was configured without -DAUTOSTAGE_WITH_CUDA=ON): build "
                       "it with CUDA against a CUDA LibTorch, or use device=cpu");
    AUTOSTAGE_CHECK_AS(ConfigError, facts.gpuCount > 0,
                       "device=cuda, but torch sees no GPU in "
                       "this process (check CUDA_VISIBLE_DEVICES and the driver with nvidia-smi), "
                       "or use device=cpu");
  }
  const bool cuda = device == "cuda" || (device == "auto" && facts.cudaBuilt && facts.gpuCount > 0);
  if (!cuda) {
    AUTOSTAGE_CHECK_AS(ConfigError, commBackend != "nccl",
                       "comm_backend=nccl carries CUDA "
                       "tensors, but this job runs on the cpu (device=",
                       device, facts.cudaBuilt ? ", no GPU visible" : ", a build without CUDA",
                       "): use comm_backend=mpi or auto, or device=cuda on a GPU node");
    p.why = device == "cpu"   ? "device=cpu"
            : facts.cudaBuilt ? "device=auto: no GPU visible"
                              : "device=auto: this build has no CUDA";
    return p;
  }
  p.device = cudaDevice(facts, localRank);
  const bool sharing = ranksPerNode > facts.gpuCount;
  const std::string layout = std::to_string(ranksPerNode) + " ranks on this node, " +
                             std::to_string(facts.gpuCount) + " GPU(s)";
  if (commBackend == "nccl") {
    AUTOSTAGE_CHECK_AS(ConfigError, !sharing, "comm_backend=nccl with ", layout,
                       ": NCCL refuses "
                       "two ranks on one GPU; start at most ",
                       facts.gpuCount,
                       " rank(s) per "
                       "node, or use comm_backend=mpi (or auto)");
    p.commBackend = "nccl";
    p.why = "comm_backend=nccl, " + layout;
  } else if (commBackend == "mpi" || sharing) {
    p.commBackend = "mpi";
    p.why = commBackend == "mpi" ? "comm_backend=mpi"
                                 : "comm_backend=auto: " + layout +
                                       ", and NCCL refuses two "
                                       "ranks on one GPU, so CUDA tensors go over MPI";
  } else {
    p.commBackend = "nccl";
    p.why = "comm_backend=auto: one GPU per rank (" + layout + ")";
  }
  return p;
}

}  // namespace autostage::driver
