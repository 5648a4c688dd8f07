#pragma once
// autostage::driver::Module — how a job gets its plan and runs it; the C++ API (autostage::Module,
// bindings/cpp/module.h) and the Python `autostage.Module` are thin callers of it.
//
//   driver::Module module(torch::jit::load("model.pt"), driver::ModuleOptions::fromConfig());
//   auto out = module.forward({x});              // every rank passes its local batch
//   lossFn(out[0], y).backward();                // drives the pipeline backward on every rank
//   optimizer.step();                            // over module.parameters() (local ones)
//
// Note [Getting a plan]
// One sequence of named steps, each agreed by all ranks (Note [Bad input on one rank]), runs in
// this folder and nowhere else; nothing below (staging/, profiler/, decomposer/) calls back up:
//   1. resolve the job, once, when the Module is made (Note [Resolving the job] in job.h;
//      device and transport: Note [Device and transport] in placement.h);
//   2. agree on the call and the inputs: one exchange per call (Note [One agreement per call]);
//   3. trace/import the model on the first call of a mode, or when the inputs' shapes change
//      under allow_replan (tracing and importing the model);
//   4. rank 0 takes the plan from the first source that has one (Note [Where a plan comes from]
//      in plan_sources.h): the deployment file, else the planner (ModuleOptions::planner, or
//      the job's service::Planner: the planning service, the plan store, the local profile +
//      plan); then broadcasts it;
//   5. every rank verifies it once (Note [One verification] in staging/route_check.h);
//   6. deploy: staging::Executor builds this rank's stage and copies rank 0's parameters.
// Every call is collective: all ranks call forward/backward/trainStep in the same order. Outputs
// carry an autograd node, so the caller's backward on each rank runs the pipeline backward and
// the gradient synchronisation (Note [Gradient scaling]); every rank must call backward once per
// forward, with gradients for the outputs it used.
//
// Note [Saved deployments]
// A deployment file records the world size, device memory, global batch and graph hash it was
// planned for, and the planner options. Loading one (load_deployment) checks each against this
// job and names the field that does not fit: world size, graph hash and batch must be equal;
// device memory may be smaller than this job's (a plan for more memory might not fit). With
// save_deployment rank 0 writes every deployment it plans (not loaded ones), with the hosts of
// a multi-host job (Note [Hosts of a deployment] in core/deployment.h), to deployment_file;
// partitioning_dry_run_np=N plans for N ranks and a global batch of N local batches, saves the
// plan and ends the job, so that a later launch on N ranks loads it.
//
// Note [One deployment per usage]
// forward() with gradients enabled, forward() under no_grad and trainStep() run different
// schedules and hold different memory (Note [Plan usage] in core/plan_usage.h), so each gets a
// plan made for it: the module keeps one deployment per usage over one imported model, made on
// the first call of that usage (the planner reuses the model's profile, so only planning runs
// again) and reused after. On a switch the ranks first share the current parameters and buffers
// from the holders of the deployment that ran last (shareState), and the switch is logged.
// The optimizer follows the training deployment (trainingParameters): an inference deployment
// never changes which parameters a rank updates. When the training deployment changes,
// gradients of parameters the previous one did not give this rank are dropped (stale).
//
// Note [Train and eval modes]
// Dropout and BatchNorm compute differently in train and eval mode, and the import turns
// `self.training` into a constant (frontend/torchscript/importer.cpp), so each mode needs its own
// import and its own deployments. The module follows the jit::Module's mode at each call
// (train()/eval() here or on the jit::Module itself; with a tracer, the mode its caller gives
// train() before each call, the traced model's own): on the first call after a mode change it
// shares the current state from the holders (shareState), parks the import and deployments of
// the mode it leaves, and imports and plans the new mode once, or takes back its parked ones.
// trainingExecutor_ is not per mode: the optimizer keeps the parameters of the training
// deployment that ran last (normally train mode's; an eval forward under NoGradGuard is an
// inference deployment and never changes it). This is the one mode switch: autostage.Module in
// Python gives its model's mode and lets this module switch (Note [Train and eval deployments]
// in module.py). A replan (allowReplan) drops the parked mode too: it was made for the old
// shapes. Every rank must call in the same mode; the input agreement checks it.
//
// Note [Bad input on one rank]
// Every check that may fail on some ranks only (argument types, batch dims, tracing, loading a
// deployment, planning on rank 0, validating the plan) is followed by a status exchange
// (comm/agreement.h), so all ranks throw the same error and none is left blocked in a
// collective; those errors leave the module usable (deployed or not, as before the call). Each
// call first agrees on the inputs: all ranks must pass the same shapes and dtypes; when dims other
// than 0 or dtypes differ from the traced ones, the module retraces and replans
// (options.allowReplan) or throws an error naming both. Errors raised while the pipeline runs
// (forward/backward on one rank) cannot be agreed on: they carry the rank and stage, and the
// other ranks fail after comm_timeout_s naming the rank they waited for.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include "comm/agreement.h"
#include "comm/backend.h"
#include "core/deployment.h"
#include "core/config.h"
#include "core/error.h"
#include "core/ir/graph.h"
#include "core/plan_usage.h"
#include "core/precision.h"
#include "frontend/torchscript/importer.h"
#include "driver/job.h"
#include "driver/placement.h"
#include "staging/checkpoint.h"
#include "staging/executor.h"

namespace autostage::driver {

class AutoPlanner;
using staging::Executor;
using staging::MemoryMeter;

// What a planner sees: the imported model (graph + the module's own parameter tensors), rank 0's
// local example batch (for profiling), the cluster to plan for (this job's, or a dry run's) and
// the global batch size.
struct PlanningInput {
  const torchscript::ImportedModel& model;
  const std::vector<c10::IValue>& exampleInputs;
  int worldSize;  // cluster.devices
  int64_t globalBatch;
  core::ClusterSpec cluster;
  // The API the plan is for (Note [Plan usage] in core/plan_usage.h).
  core::PlanUsage usage = core::PlanUsage::TrainStep;
  // The options the plan uses: the process-wide ones with the module's own over them (Note
  // [Per-module plan options]).
  core::Config config = core::globalConfig();
};

// A planner of the caller's own (tests, a user's planner). Called on rank 0 only; an exception it
// throws is re-thrown as PlanError on every rank.
using PlanningCallback = std::function<core::Deployment(const PlanningInput& input)>;

// What a tracer captured: a TorchScript module to import (script), or a model a front end
// already imported into the IR (imported; the torch.export front end, autostage/export.py).
struct CapturedModel {
  torch::jit::Module script{"autostage_untraced"};
  std::shared_ptr<torchscript::ImportedModel> imported;
};

// Captures the model for a call's inputs (the Python binding exports or traces the user's
// nn.Module with them). Unset: the module given to the constructor is imported as is.
using TraceCallback = std::function<CapturedModel(const std::vector<c10::IValue>& inputs)>;

struct ModuleOptions {
  // null: MPI, with tensors over "mpi" or "nccl" as device and comm_backend choose (Note
  // [Device and transport] in placement.h); given: this transport (tests: thread ranks).
  std::shared_ptr<comm::Backend> backend;
  // Unset: the planning service (planner_address) and the local profile + plan (auto_planner.h).
  PlanningCallback planner;
  std::string deploymentPath;              // load this saved deployment instead of planning
  // This module's plan options over the process-wide ones, e.g. zero=0 for a module whose
  // optimizer cannot be sharded (Note [Per-module plan options]).
  std::map<std::string, std::string> planOptions;
  TraceCallback tracer;                    // see TraceCallback
  int64_t gradientBucketBytes = 25 << 20;
  bool allowReplan = false;                // retrace + replan when traced shapes change
  std::string traceDirectory;              // non-empty: write event traces (Note [Trace files])
  int traceSteps = 10;                     // steps kept in each trace file
  // Note [Saved deployments]: rank 0 writes the deployment it planned here (save_deployment).
  std::string saveDeploymentPath;
  // partitioning_dry_run_np: plan for this many ranks, save to saveDeploymentPath, throw
  // DryRunFinished on every rank instead of deploying. 0: off.
  int dryRunWorldSize = 0;
  // The caller's optimizer steps only this rank's ZeRO-1 pieces (Note [ZeRO-1] in
  // staging/gradient_sync.h): false refuses a deployment with zero stages (a loaded one, too).
  bool shardsOptimizer = true;
  // Mixed precision (config key precision): the import probe and the stages run under autocast
  // (Note [Autocast execution] in frontend/torchscript/autocast.h); parameters stay fp32.
  core::Precision precision = core::Precision::Fp32;
  // Measures each rank's memory every step (Note [Measured memory]); null: not measured.
  std::shared_ptr<MemoryMeter> memoryMeter;
  // Unset or memoryMeter given: not used. Else it makes memoryMeter once the job's device is
  // resolved (the CUDA caching allocator's counters for a CUDA job, not the host's).
  std::function<std::shared_ptr<MemoryMeter>(const Placement& placement)> memoryMeterFor;
  // From the config options allow_replan, trace_events, trace_events_dir,
  // trace_events_steps, save_deployment, load_deployment, deployment_file,
  // partitioning_dry_run_np and precision.
  static ModuleOptions fromConfig();
  void validate() const;
  std::string toString() const;
};

// Thrown on every rank when a dry run (ModuleOptions::dryRunWorldSize) has saved its plan. The
// Python binding turns it into SystemExit(0), as RaNNC ends the process after a dry run.
class DryRunFinished : public Error {
  using Error::Error;
};

// Where a rank's stages run: cuda:index for a CUDA placement, otherwise the CPU.
c10::Device stageDeviceOf(const Placement& placement);

// Note [One agreement per call]
// Before any collective step of a call, the ranks make one exchange (comm::agreeAndGather) that
// agrees on everything the call depends on: `how` each rank calls (method, mode, no_grad, and for
// the Python API the call's keywords and constants: checkCalledAlike), its inputs (tensors, batch
// in dim 0, on the CPU or a CUDA device, the same dtypes and shapes on every rank:
// checkSameAcrossRanks), and a `problem` a wrapper found before (Note [Bad input on one rank]).
// Module::forward/trainStep make it themselves; the Python API makes it first (its own steps,
// switching modes or retracing, are collective too) and then calls them with agreed=true.
// Returns the inputs as tensors; throws the same error on every rank.
// `step` names the exchange in the error ("checking the inputs failed on rank 2: ...").
std::vector<at::Tensor> agreeOnCall(comm::Backend& backend, const std::vector<c10::IValue>& inputs,
                                    const std::string& how, comm::StepStatus problem = {},
                                    const std::string& step = "checking the inputs");

class Module {
 public:
  // Resolves the job (Note [Resolving the job]). Collective when no planner is given, the world
  // has several ranks and measure_comm is on: the AutoPlanner measures the links.
  Module(torch::jit::Module module, ModuleOptions options);
  ~Module();

  // What this job runs on, as resolved when the module was made.
  const JobSpec& job() const { return job_; }
  // Where this rank's stages run (stageDeviceOf(job().placement)).
  c10::Device stageDevice() const { return stageDevice_; }
  // Note [Placing the model] (model_device.h): moves these tensors of the model (parameters and
  // buffers, by state_dict name) from the CPU to stageDevice() in place, or throws ConfigError
  // on every rank when one is on another device. The constructor does it for the jit::Module
  // given; a tracer's caller (autostage.Module) calls it with the traced model's tensors before
  // the first call. Collective.
  void placeTensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

  // gpipe forward (usage forward_backward, or inference under no_grad; Note [One deployment
  // per usage]); deploys on the first call of its usage. Inputs: tensors, batch in dim 0, on
  // the CPU or a CUDA device (moved to stageDevice()); the outputs come back on input 0's
  // device, and so do the losses of trainStep.
  // `agreed`: the caller already agreed on this call with agreeOnCall (Note [One agreement per
  // call]).
  std::vector<at::Tensor> forward(const std::vector<c10::IValue>& inputs, bool agreed = false);
  // Forward+backward+gradient synchronisation in the schedule planned for train_step (1f1b or
  // gpipe) for a model returning its loss(es); returns the global-batch losses (Note [Loss
  // outputs]). Deploys on the first call of its usage.
  std::vector<at::Tensor> trainStep(const std::vector<c10::IValue>& inputs, bool agreed = false);
  // Note [Dynamic loss scaling] (staging/loss_scaler.h): the gradient trainStep starts each loss's
  // backward from (1 unless set; the returned losses are not scaled), and the unscaling of the
  // training deployment's gradients: divides them by `scale` and returns their global norm, not
  // finite when any rank's gradients overflowed (the same on every rank: skip the step on all).
  // unscaleGradients is collective.
  void setLossScale(double scale);
  double lossScale() const { return lossScale_; }
  double unscaleGradients(double scale);

  // Note [Train and eval modes]: sets the mode of the wrapped jit::Module (like
  // torch::nn::Module::train), or with a tracer the mode its model is in (the tracer's caller
  // sets it before each call); the next call runs the deployment of that mode. Local; every
  // rank must make its next call in the same mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool isTraining() const { return options_.tracer ? tracerTraining_ : module_.is_training(); }

  bool ready() const { return executor_ != nullptr; }
  // How many deployments the module made (1 after the first call; +1 per new usage or replan).
  int deploymentCount() const { return deploymentCount_; }
  // Changes whenever the training deployment (the one whose parameters the optimizer holds)
  // changes; 0 until a training call (forward with gradients, or trainStep) ran.
  int trainingSelection() const { return trainingSelection_; }
  // Bytes of the optimizer state of parameters() as the caller's optimizer holds it now, for the
  // measured memory (Note [Measured memory]); call before each step (autostage.Module does).
  // Inference deployments hold no optimizer state and count none.
  void setOptimizerStateBytes(int64_t bytes);
  // The usage of the deployment that ran last; throws Error before deployment.
  core::PlanUsage usage() const;
  // This rank's parameters of the training deployment (requires_grad tensors of its stage):
  // what the optimizer updates. Empty before a training call.
  std::vector<at::Tensor> parameters() const;
  std::vector<std::pair<std::string, at::Tensor>> namedParameters() const;
  // The deployment that ran last. Throws Error before deployment.
  const core::Deployment& deployment() const;
  // The whole model's parameters and buffers, current, keyed like the original module's
  // state_dict, on every rank (Note [Gathering the state]). Collective; throws before deployment.
  std::vector<std::pair<std::string, at::Tensor>> stateDict();
  // Loads a state dict of the original module (e.g. stateDict() of another job) into the
  // module's own tensors, which every deployment of it shares; before or after deployment, on
  // every rank with the same values. Throws FormatError naming each key that does not fit, having
  // loaded nothing (staging/state_dict_load.h).
  void loadStateDict(const std::vector<std::pair<std::string, at::Tensor>>& state,
                     bool strict = true);
  // `state` (whole tensors by state_dict name) with the tensors this rank holds in
  // tensor-parallel slices cut to its slice (Note [Tensor-parallel parameters]).
  std::vector<std::pair<std::string, at::Tensor>> sliceState(
      std::vector<std::pair<std::string, at::Tensor>> state) const;
  // Waits for every rank. Collective.
  void barrier() { backend_->barrier(backend_->world()); }
  // Writes every parameter's and buffer's current value (from this deployment's holders) into
  // every rank's own tensors, before another deployment of the same tensors takes over (the
  // model's other train/eval mode). Collective; throws before deployment.
  void shareState();
  // The executor that ran last; throws Error before deployment.
  Executor& executor();
  // The training deployment's executor (gradients, clipping, allreduce); throws Error before a
  // training call.
  Executor& trainingExecutor();
  int rank() const { return backend_->rank(); }
  int worldSize() const { return backend_->worldSize(); }

 private:
  // Agrees on the inputs across ranks, deploys on the first call or when the traced shapes
  // changed (Note [Bad input on one rank]); returns the tensors.
  // *callerDevice: the device of the caller's input 0; the tensors returned are on
  // stageDevice_.
  std::vector<at::Tensor> prepareStep(const std::vector<c10::IValue>& inputs,
                                      core::PlanUsage usage, bool agreed, c10::Device* callerDevice);
  // Traces and imports the model for these inputs; drops the deployments of the previous import
  // of this mode.
  void importFor(const std::vector<at::Tensor>& inputs);
  // Note [Train and eval modes]: parks this mode's import and takes back (or clears for an
  // import) the other's. Collective (shares the state first, for `usage`'s deployment there).
  void switchMode(bool training, core::PlanUsage usage);
  // shareState for `next` (none when it is still to be planned): the slices it holds alike stay
  // (Note [Keeping slices across a switch] in staging/checkpoint.cpp).
  void shareStateFor(const Executor* next);
  // The parameters held in tensor-parallel slices now: the current executor's after it sliced
  // them, those a switch kept until the next one takes them.
  void noteSlicesOf(const Executor& executor);
  // How this rank calls ("forward, eval mode, no_grad"), compared across ranks.
  std::string callDescription(core::PlanUsage usage) const;
  // Makes `usage` the current deployment: reuses its executor or plans and deploys it.
  void switchTo(core::PlanUsage usage, const std::vector<at::Tensor>& inputs);
  void deploy(const std::vector<at::Tensor>& inputs, core::PlanUsage usage);
  // Note [One deployment per usage]: the optimizer's parameters follow `executor`.
  void followTraining(const std::shared_ptr<Executor>& executor);
  void importModel(const std::vector<c10::IValue>& examples);
  void logCapture() const;  // which front end captured it (Note [Front ends], autostage/export.py)
  // Note [Getting a plan], steps 4 and 5: the plan for this call, taken by rank 0 from the first
  // source that has one, broadcast and verified on every rank. Collective.
  staging::VerifiedDeployment obtainDeployment(const std::vector<c10::IValue>& examples,
                                               int64_t globalBatch, core::PlanUsage usage);
  // Rank 0: the plan from the first source that has one (Note [Where a plan comes from]); sets
  // *elsewhere when it was planned for another job (a deployment file, a planner's store).
  core::Deployment firstPlan(const std::vector<c10::IValue>& examples, int64_t globalBatch,
                             core::PlanUsage usage, bool* elsewhere);
  // Rank 0 writes a plan made for this job to saveDeploymentPath (Note [Saved deployments]).
  // Collective: every rank calls it, and a failure to write is every rank's error.
  void savePlanned(const core::Deployment& deployment);
  // The process-wide options with options_.planOptions over them (Note [Per-module plan options]).
  core::Config planConfig() const;
  // The planner's plan: ModuleOptions::planner, or the AutoPlanner; *fromStore (when given):
  // the plan was kept from an earlier plan, not made for this call.
  core::Deployment plan(const PlanningInput& input, bool* fromStore = nullptr);
  // Rank 0 of a dry run: plans for dryRunWorldSize ranks and saves the plan.
  void planDryRun(const std::vector<c10::IValue>& examples, int64_t globalBatch,
                  core::PlanUsage usage);
  void checkBatchFits(int64_t localBatch) const;
  // Rethrows the exception being handled with this rank and its stage in front of the message.
  [[noreturn]] void rethrowWithContext() const;

  torch::jit::Module module_;
  ModuleOptions options_;
  std::shared_ptr<comm::Backend> backend_;
  JobSpec job_;                              // Note [Resolving the job]
  // Each rank's hostname when the job spans several hosts, else empty (Note [Hosts in the log]);
  // every deployment this module runs carries it (Note [Hosts of a deployment]).
  std::vector<std::string> hosts_;
  std::unique_ptr<AutoPlanner> autoPlanner_;  // when options_.planner is unset
  // Shared with the autograd node of forward()'s outputs, which may run backward after the
  // Module is gone (the executors refer to it).
  std::shared_ptr<torchscript::ImportedModel> model_;
  std::shared_ptr<Executor> executor_;          // the deployment that ran last
  std::shared_ptr<Executor> trainingExecutor_;  // Note [One deployment per usage]
  std::map<core::PlanUsage, std::shared_ptr<Executor>> executors_;  // of the current import
  std::string tracedSignature_;  // inputs of the deployed trace, dim 0 written as B
  // Note [Train and eval modes]: the mode model_ was imported in, and the other mode's import.
  struct ParkedImport {
    std::shared_ptr<torchscript::ImportedModel> model;
    std::map<core::PlanUsage, std::shared_ptr<Executor>> executors;
    std::shared_ptr<Executor> last;  // the one that ran last in that mode
    std::string tracedSignature;
  };
  bool importedTraining_ = true;
  bool tracerTraining_ = true;  // with a tracer: the mode train() was last given
  std::map<bool, ParkedImport> parked_;
  staging::SliceLayouts slicedNow_;  // Note [Keeping slices across a switch]
  int deploymentCount_ = 0;
  double lossScale_ = 1.0;  // setLossScale
  std::vector<at::Tensor> trainingParams_;     // this rank's parameters of the training one
  int trainingSelection_ = 0;
  int64_t optimizerStateBytes_ = -1;  // Note [Measured memory]; < 0: not reported
  at::Tensor anchor_;  // requires grad, so the outputs' autograd node is always executable
  c10::Device stageDevice_ = c10::Device(c10::DeviceType::CPU);  // where the stages run
};

}  // namespace autostage::driver
