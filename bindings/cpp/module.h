#pragma once
// The C++ API:
//
//   autostage::Module module(torch::jit::load("model.pt"));
//   auto out = module.forward({x});       // every rank passes its local batch
//   lossFn(out[0], y).backward();         // runs the pipeline backward on every rank
//   optimizer.step();                     // over module.parameters() (this rank's)
//
// staging::Module with autoPlanner() (profile + plan on rank 0) unless the options name another
// planner or a saved deployment. Launch with mpirun; one process per rank.

#include "bindings/cpp/auto_planner.h"
#include "bindings/cpp/memory_meters.h"
#include "staging/module.h"

namespace autostage {

using ModuleOptions = staging::ModuleOptions;

class Module : public staging::Module {
 public:
  explicit Module(torch::jit::Module module, ModuleOptions options = ModuleOptions::fromConfig())
      : staging::Module(std::move(module), withDefaultPlanner(std::move(options))) {}

 private:
  static ModuleOptions withDefaultPlanner(ModuleOptions options) {
    if (!options.planner && options.deploymentPath.empty()) options.planner = autoPlanner(options.backend);
    if (options.deviceMemory == 0) options.deviceMemory = jobDeviceMemory(core::globalConfig());
    if (!options.memoryMeter && core::globalConfig().getBool("measure_memory"))
      options.memoryMeter = cpuMemoryMeter();
    return options;
  }
};

}  // namespace autostage
