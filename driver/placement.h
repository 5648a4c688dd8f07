#pragma once
// Where a job's stages run and how their tensors travel between ranks (Note [Device and
// transport]). Torch-free logic over the facts of this process, so every rule is unit-tested on
// machines without a GPU.

#include <cstdint>
#include <string>
#include <vector>

namespace autostage::driver {

// Note [Device and transport]
// Resolved once, with the job (Note [Resolving the job] in job.h). Option device = auto | cpu |
// cuda: auto picks CUDA when this build has it (-DAUTOSTAGE_WITH_CUDA=ON) and torch sees a GPU;
// rank r then uses cuda:(local rank mod GPU count). Option comm_backend = auto | nccl | mpi says
// how tensors travel (MPI is always the control plane): a CPU job uses mpi; a CUDA job uses nccl
// unless the ranks of a node share GPUs (NCCL refuses two ranks on one GPU), where auto picks mpi
// and says why. Each refusal names what was found and what to do. The facts are per node, so the
// Module agrees on the outcome across ranks ("choosing the device") and no rank is left waiting.
// Over mpi, a CUDA job's tensors travel through host memory (Note [CUDA tensors over MPI] in
// comm/host_staging.h); the stages, their rows, gradients and the model's tensors stay on the
// rank's GPU (Note [Placing the model] in model_device.h).
struct DeviceFacts {
  struct Gpu {
    std::string name;        // "NVIDIA H100 80GB HBM3"
    int64_t totalBytes = 0;  // its memory
  };
  bool cudaBuilt = false;  // this build has the CUDA profiler and the NCCL backend
  int gpuCount = 0;        // GPUs torch sees in this process
  // Each of them, when known (a CUDA build asks the runtime; tests may leave it empty).
  std::vector<Gpu> gpus;
  // This process: the build flag, torch::cuda::device_count() and, in a CUDA build, each
  // device's properties.
  static DeviceFacts ofThisProcess();
};

// Note [Device kinds]
// The kind of device a job's stages run on is parsed from the option `device` (cpu | cuda | auto)
// and the transport once, here (choosePlacement, transportPlacement); the rest of the code reads
// the kind (Device::kind, Note [One device]), never the option's text, and c10::Device
// (stageDeviceOf in module.h) where torch needs one.
enum class DeviceKind { Cpu, Cuda };
// "cpu" | "cuda": the option's text of `kind`.
const char* deviceKindName(DeviceKind kind);

// Note [One device]
// The device a rank's stages run on is one value, resolved once with the job (choosePlacement or
// transportPlacement from DeviceFacts, the driver's one question to CUDA about its GPUs; the CPU's
// memory by resolveJob) and passed down: its kind, its CUDA index, its model and its memory.
// Profiles and plans name it by kindText() ("cuda:NVIDIA H100 80GB HBM3"), so those kept for
// one GPU model are not used on another; the memory a plan assumes per rank is derived from it
// (JobSpec::memoryPerDevice).
struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = -1;           // cuda:index; -1 on the CPU
  std::string model;        // the GPU's name; empty on the CPU or where CUDA did not describe it
  int64_t memoryBytes = 0;  // the GPU's total memory; on the CPU, this node's physical memory
  bool onCuda() const { return kind == DeviceKind::Cuda; }
  // "cpu", "cuda:" + the model, or "cuda" when the model is not known.
  std::string kindText() const;
  std::string toString() const;  // "cpu", "cuda:1"
};

struct Placement {
  Device device;
  std::string commBackend = "mpi";  // mpi | nccl
  std::string why;                  // for the log: how auto decided
  std::string toString() const;     // "cpu over mpi", "cuda:1 over nccl"
  bool onCuda() const { return device.onCuda(); }
  // The GPU for profiler::createMeasurementBackend: the device's index (0 when unset) on CUDA,
  // -1 on the CPU.
  int cudaIndex() const { return onCuda() ? (device.index < 0 ? 0 : device.index) : -1; }
};

// Throws ConfigError for an unknown value, device=cuda without CUDA or without a GPU,
// comm_backend=nccl for a CPU job or for ranks sharing GPUs.
Placement choosePlacement(const std::string& device, const std::string& commBackend,
                          const DeviceFacts& facts, int localRank, int ranksPerNode);
// The placement for a transport the caller gave (transport "nccl" carries CUDA tensors, any
// other CPU ones); ConfigError when the option `device` asks for the other kind.
Placement transportPlacement(const std::string& device, const std::string& transport,
                             const DeviceFacts& facts, int localRank);

}  // namespace autostage::driver
