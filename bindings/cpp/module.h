#pragma once
// The C++ API:
//
//   autostage::Module module(torch::jit::load("model.pt"), {{"partition_num", "2"}});
//   at::Tensor out = module.forward({x})[0];   // every rank passes its local batch
//   torch::mse_loss(out, y).backward();        // runs the pipeline backward on every rank
//   torch::optim::SGD opt(module.parameters(), 0.1);  // after the first call
//   opt.step();
//   module.eval();                             // eval mode: that mode's own deployment
//   { torch::NoGradGuard g; module.forward({x}); }    // an inference deployment
//
// driver::Module (driver/module.h: forward, trainStep, parameters, stateDict, loadStateDict,
// train/eval, deployment, job, ...; it gets the plan: Note [Getting a plan]) with the job's
// device allocator (the counting CPU allocator, or the rank's GPU's caching allocator) measuring
// each step's memory (measure_memory). Launch with mpirun; one process per rank. Every call marked
// collective must be made on every rank, and forward/trainStep in the same mode and grad mode.
//
// The model: a torch::jit::Module, traced or scripted in Python (torch::jit::load) or built in
// C++ (register a bool `training` attribute for train()/eval(): Note [Train and eval modes]).
// The optimizer: any torch::optim optimizer over parameters(), made after the first training
// call (this rank's parameters are known once a plan is deployed). They stay the same across
// eval and no_grad calls; when trainingSelection() changes (a replan under allow_replan, or a
// forward with gradients in the other mode) build the optimizer again over parameters().
// Errors are autostage::Error subclasses (core/error.h) with the messages the Python API gives.
// fp16 (precision=fp16: CUDA, or the CPU from LibTorch 2.5) with dynamic loss scaling (Note
// [Dynamic loss scaling]):
//   autostage::LossScaler scaler;                       // GradScaler's defaults
//   module.setLossScale(scaler.scale());                // trainStep seeds its backward with it
//   auto losses = module.trainStep({x, y});             // (or (loss * scaler.scale()).backward())
//   double norm = module.unscaleGradients(scaler.scale());
//   if (std::isfinite(norm)) optimizer.step();           // the same verdict on every rank
//   scaler.update(std::isfinite(norm));

#include <map>
#include <string>

#include "bindings/cpp/memory_meters.h"
#include "bindings/cpp/zero_optimizer.h"
#include "core/config.h"
#include "core/proto/deployment_file.h"
#include "driver/module.h"
#include "driver/plan_sources.h"
#include "staging/loss_scaler.h"

namespace autostage {

using ModuleOptions = driver::ModuleOptions;
using LossScaler = staging::LossScaler;
using LossScalerOptions = staging::LossScalerOptions;
// Config keys and values, as the Python API takes them (autostage.Module(model, partition_num=2)).
using ConfigOptions = std::map<std::string, std::string>;

class Module : public driver::Module {
 public:
  // `shardsOptimizer`: the caller's optimizer is built over ZeroParameters(module).tensors() and
  // stepped through ZeroParameters::step (Note [ZeRO-1 in the C++ API]), so plans may use ZeRO-1
  // (option zero); otherwise it steps whole parameters() and its plans never use ZeRO-1 (zero=auto
  // is 0 for this module, zero=1 throws UnsupportedError).
  explicit Module(torch::jit::Module module, ModuleOptions options = ModuleOptions::fromConfig(),
                  bool shardsOptimizer = false)
      : driver::Module(std::move(module), withDefaults(std::move(options), shardsOptimizer)) {}
  // Sets each config key (process-wide, like the Python API; an unknown key or a bad value throws
  // ConfigError naming it) and takes the options from the config table.
  Module(torch::jit::Module module, const ConfigOptions& config)
      : Module(std::move(module), fromConfig(config)) {}

  // Clips the gradients of the whole model by their global L2 norm (each parameter once over all
  // stages and replicas, like torch::nn::utils::clip_grad_norm_); returns the norm before
  // clipping. Collective.
  double clipGradNorm(double maxNorm) { return trainingExecutor().clipGradNorm(maxNorm); }
  // Gradient accumulation: while delayGradAllreduce(true), backward leaves gradients local;
  // allreduceGrads() then sums them over their holders once. Collective.
  static void delayGradAllreduce(bool delay) { staging::setDelayGradAllreduce(delay); }
  void allreduceGrads() { trainingExecutor().allreduceGrads(); }
  // Writes the deployment that ran last (load it with ModuleOptions::deploymentPath or
  // load_deployment=true deployment_file=PATH). Call on one rank.
  void saveDeployment(const std::string& path) const { core::saveDeployment(deployment(), path); }

 private:
  // ZeRO-1 (Note [ZeRO-1] in staging/gradient_sync.h) needs an optimizer that steps only this
  // rank's pieces and an all-gather after each step (ZeroParameters); a torch::optim optimizer
  // over parameters() does not. Without shardsOptimizer plans never shard.
  static void noZero(ModuleOptions& options) {
    // Note [Choosing ZeRO-1 for a module] in driver/plan_sources.h.
    if (driver::plansWithoutZero(
            core::globalConfig(), /*trainable=*/true,
            "this module was made for a torch::optim optimizer over parameters(), which does not "
            "step only this rank's pieces as zero=1 (ZeRO-1) needs; construct "
            "autostage::Module(model, options, /*shardsOptimizer=*/true) and step the optimizer "
            "through autostage::ZeroParameters, or set zero=0"))
      options.planOptions["zero"] = "0";
  }
  static ModuleOptions fromConfig(const ConfigOptions& config) {
    for (const auto& [key, value] : config)
      core::globalConfig().set(key, value, "autostage::Module(" + key + "=...)");
    return ModuleOptions::fromConfig();
  }
  static ModuleOptions withDefaults(ModuleOptions options, bool shardsOptimizer) {
    if (!shardsOptimizer) noZero(options);
    options.shardsOptimizer = shardsOptimizer;
    if (!options.memoryMeter && core::globalConfig().getBool("measure_memory"))
      options.memoryMeterFor = memoryMeterFor;
    return options;
  }
};

}  // namespace autostage
