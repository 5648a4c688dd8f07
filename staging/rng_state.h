#pragma once
// The random generator states a recompute stage saves in its forward and restores for its
// re-run (Note [Recompute] in staging/stage_runner.h).
//
// Note [Recompute RNG state]
// Random ops (dropout) draw from the default generator of the device their tensors are on: the
// CPU generator for CPU tensors, CUDA device i's generator for tensors on cuda:i. A recompute
// stage saves the CPU generator's state (always: a CPU stage behaves as it always did) and that
// of the CUDA generator of every device its tensors are on, and its re-run restores them all, so
// the re-run draws the forward's masks. Which generators: rngDevices(), a pure function of the
// devices, testable without a GPU.

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace autostage::staging {

// The devices whose default generators a stage with tensors on `tensorDevices` saves: the CPU
// first, then each distinct CUDA device in index order (a CUDA device without an index stands
// for the current device). Other device types are ignored.
std::vector<c10::Device> rngDevices(const std::vector<c10::Device>& tensorDevices);

// Generator states, one per device.
using RngStates = std::vector<std::pair<c10::Device, at::Tensor>>;

// The current states of the default generators of `devices`.
RngStates saveRngStates(const std::vector<c10::Device>& devices);

// Sets each listed device's default generator to its state; returns the states they had.
RngStates swapRngStates(const RngStates& states);

// Seeds the default generators of `devices` with `seed` (as torch.manual_seed would each).
void seedRngStates(const std::vector<c10::Device>& devices, uint64_t seed);

}  // namespace autostage::staging
