#include "staging/rng_state.h"

#include <algorithm>
#include <mutex>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

namespace autostage::staging {
namespace {

// Sets `device`'s default generator to `state` (undefined: leaves it); returns its old state.
at::Tensor swapState(c10::Device device, const at::Tensor& state) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  at::Tensor old = generator.get_state();
  if (state.defined()) generator.set_state(state);
  return old;
}

}  // namespace

std::vector<c10::Device> rngDevices(const std::vector<c10::Device>& tensorDevices) {
  std::vector<c10::Device> cuda;
  for (const c10::Device& device : tensorDevices)
    if (device.is_cuda() && std::find(cuda.begin(), cuda.end(), device) == cuda.end())
      cuda.push_back(device);
  std::sort(cuda.begin(), cuda.end(),
            [](const c10::Device& a, const c10::Device& b) { return a.index() < b.index(); });
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  devices.insert(devices.end(), cuda.begin(), cuda.end());
  return devices;
}

RngStates saveRngStates(const std::vector<c10::Device>& devices) {
  RngStates states;
  for (const c10::Device& device : devices) states.emplace_back(device, swapState(device, {}));
  return states;
}

RngStates swapRngStates(const RngStates& states) {
  RngStates old;
  for (const auto& [device, state] : states) old.emplace_back(device, swapState(device, state));
  return old;
}

void seedRngStates(const std::vector<c10::Device>& devices, uint64_t seed) {
  for (const c10::Device& device : devices) {
    at::Generator generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(seed);
  }
}

}  // namespace autostage::staging
