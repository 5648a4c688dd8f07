#pragma once
// What this job runs on, resolved once (Note [Resolving the job]).

#include <cstdint>
#include <string>

#include "comm/backend.h"
#include "core/cluster_spec.h"
#include "core/config.h"
#include "driver/placement.h"

namespace autostage::driver {

// Note [Resolving the job]
// A Module resolves the job it runs in once, when it is made, on every rank alike: the world
// size, the ranks sharing this node (from the comm backend: MPI's shared-memory split, not a
// launcher's environment variables), the device (Note [Device and transport]), and the memory of
// one device: mem_limit_gb when set; else for a CPU job this node's physical memory shared by the
// ranks on it, for a CUDA job its GPU's total memory shared by the ranks on that GPU (the planner
// never sees host RAM for a GPU job). The device is one value (Note [One device] in
// placement.h): its kind text names the model ("cuda:NVIDIA H100 80GB HBM3"), so plans and
// profiles kept for one GPU model are not used on another.
// Everything that depends on them reads them from here: the cluster the local planner and the
// planning service plan for (and so the plan key), the memory check of a loaded deployment and the
// measured-memory record. A dry run (partitioning_dry_run_np=N) plans for N ranks on this node:
// cluster(N, N).
struct JobSpec {
  int worldSize = 1;
  int ranksPerNode = 1;
  Placement placement;             // Note [Device and transport]; its device: Note [One device]
  int gpusPerNode = 0;             // CUDA jobs: GPUs this process sees
  int64_t memoryLimit = 0;         // mem_limit_gb in bytes; 0: not set
  double bandwidth = 10e9;         // comm_bandwidth (bytes/s), intra and inter node
  double latency = 20e-6;          // comm_latency (s)

  const Device& device() const { return placement.device; }
  // Bytes one device has when `ranksPerNode` ranks share a node (and its GPUs).
  int64_t memoryPerDevice(int ranksPerNode) const;
  // This job's device memory: what a plan made now assumes (Deployment::deviceMemory).
  int64_t deviceMemory() const { return memoryPerDevice(ranksPerNode); }
  // The cluster to plan for: `devices` devices, `perNode` of them per node (0: this job's).
  core::ClusterSpec cluster(int devices, int perNode = 0) const;
  // "4 rank(s), 2 per node, cpu over mpi (...), 5.80 GiB per device (this node's 11.60 GiB
  // over 2 rank(s))".
  std::string toString() const;
};

// Reads the world and node layout from `backend`, the device and transport from the options
// device and comm_backend and `facts` (Note [Device and transport]; over a backend other than
// the default "mpi", the transport is the one given: "nccl" runs on CUDA, any other on the CPU),
// and the memory and link options from `config`. Local (no communication); the same on every
// rank of a node. Throws ConfigError naming what does not fit.
JobSpec resolveJob(const comm::Backend& backend, const core::Config& config,
                   const DeviceFacts& facts = {});

}  // namespace autostage::driver
