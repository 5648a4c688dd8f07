#pragma once
// Which backends exist and which one serves a tensor.
//
// registerBuiltinBackends() registers "mpi" (CPU tensors, control plane) and, when built with
// CUDA, "nccl" (CUDA tensors). createBackend(name) makes a new instance; backendFor(tensor)
// returns the process's shared instance for the tensor's device (MPI for CPU, NCCL for CUDA, or
// MPI through host memory in a build without NCCL), creating it on first use. Creating an MPI or NCCL backend is collective over the world.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/backend.h"

namespace autostage::comm {

using BackendFactory = std::function<std::shared_ptr<Backend>()>;

// Adds or replaces a backend under `name`.
void registerBackend(const std::string& name, BackendFactory factory);
// Registers the built-in backends; idempotent.
void registerBuiltinBackends();
// Registered names, sorted.
std::vector<std::string> knownBackends();
// A new instance of backend `name`; an unknown name throws ConfigError listing the known ones.
std::shared_ptr<Backend> createBackend(const std::string& name);
// The shared instance of backend `name` (created on first call).
std::shared_ptr<Backend> sharedBackend(const std::string& name);
// "mpi" for CPU tensors, "nccl" for CUDA tensors; UnsupportedError for other devices.
std::string backendNameFor(const at::Tensor& tensor);
std::shared_ptr<Backend> backendFor(const at::Tensor& tensor);

}  // namespace autostage::comm
