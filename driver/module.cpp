// driver::Module (driver/module.h): made for a job, called, switched between modes and usages,
// deployed. Its options: module_options.cpp; the autograd bridge of its outputs:
// autograd_bridge.cpp; where its plans come from: plan_sources.cpp and auto_planner.cpp.
#include "driver/module.h"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "comm/agreement.h"
#include "comm/registry.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "frontend/torchscript/autocast.h"
#include "frontend/export/interpreter.h"
#include "driver/auto_planner.h"
#include "driver/autograd_bridge.h"
#include "driver/model_device.h"
#include "driver/plan_sources.h"
#include "staging/call_inputs.h"
#include "staging/checkpoint.h"
#include "staging/loss_scaler.h"
#include "staging/sample_range.h"
#include "staging/state_dict_load.h"
#include "staging/tensor_parallel_ops.h"

namespace autostage::driver {

using namespace staging;  // the runtime this module drives (this file only)

namespace {

// Note [Hosts in the log]
// On a job spread over several hosts the partition log says which host each rank and each
// stage's replicas are on (the ranks' hostnames, gathered once when the Module is made): `Hosts:
// a (ranks 0,1), b (ranks 2,3)` after the Job line, and `Stages on hosts: STAGE_0_3 on a (ranks
// 0,1); ...` after each plan, so that replicas split across a slow link are seen in the log. The
// hostnames go into every deployment this job runs (obtainDeployment, Note [Hosts of a
// deployment] in core/deployment.h) before it is logged or saved, so that the saved file, the
// log line, `autostage show` and `autostage report` say the same.

std::string thisHostName() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// The example inputs tracing, import and profiling run with: copies on the stages' device, beside
// the model's tensors (Note [Placing the model]). The caller's tensors stay where they are and as
// they are: a model that writes into its input (RaNNC's FunctionModel zeroes token ids in place)
// would otherwise write into the caller's batch once per capture and profiling run, and an
// autograd graph the caller built on that batch would find it modified.
std::vector<c10::IValue> examplesOn(const std::vector<at::Tensor>& inputs,
                                    const c10::Device& device) {
  std::vector<c10::IValue> examples;
  for (const at::Tensor& t : inputs)
    examples.emplace_back(t.to(device, /*non_blocking=*/false, /*copy=*/true));
  return examples;
}

}  // namespace

Module::Module(torch::jit::Module module, ModuleOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  options_.validate();
  comm::registerBuiltinBackends();
  // MPI is the control plane (Note [Device and transport]); the ranks agree on the placement,
  // which depends on each node's GPUs.
  std::shared_ptr<comm::Backend> control =
      options_.backend ? options_.backend : comm::sharedBackend("mpi");
  comm::runAgreed(*control, "choosing the device", [&] {
    job_ = resolveJob(*control, core::globalConfig(), DeviceFacts::ofThisProcess());
  });
  backend_ = options_.backend || job_.placement.commBackend == "mpi"
                 ? control
                 : comm::sharedBackend(job_.placement.commBackend);
  // The stages run on the placement's device (fp16 on the CPU: Note [fp16 on the CPU]); the
  // model's tensors go there now, before any trace (Note [Placing the model]).
  stageDevice_ = stageDeviceOf(job_.placement);
  torchscript::checkAutocastSupported(options_.precision, stageDevice_.type());
  placeTensors(stateTensorsOf(module_));
  if (!options_.memoryMeter && options_.memoryMeterFor)
    options_.memoryMeter = options_.memoryMeterFor(job_.placement);
  if (!options_.planner) autoPlanner_ = std::make_unique<AutoPlanner>(backend_, job_.placement);
  anchor_ = at::zeros({}, at::kFloat).requires_grad_(true);
  auto log = core::logger("Module");
  log->debug("options: {}", options_.toString());
  const std::vector<std::string> hosts =
      backend_->allGatherBytes(thisHostName(), comm::Group::world(backend_->worldSize()));
  if (std::set<std::string>(hosts.begin(), hosts.end()).size() > 1) hosts_ = hosts;
  if (backend_->rank() == 0) {
    log->info("Job: {}", job_.toString());
    if (!hosts_.empty()) log->info("Hosts: {}", core::hostsText(hosts_));
  }
}

Module::~Module() = default;

void Module::placeTensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  comm::runAgreed(*backend_, "placing the model on " + stageDevice_.str(),
                  [&] { driver::placeTensors(tensors, stageDevice_); });
}

std::vector<at::Tensor> Module::forward(const std::vector<c10::IValue>& inputs, bool agreed) {
  const core::PlanUsage usage = at::GradMode::is_enabled() ? core::PlanUsage::ForwardBackward
                                                           : core::PlanUsage::Inference;
  c10::Device callerDevice = stageDevice_;
  std::vector<at::Tensor> tensors = prepareStep(inputs, usage, agreed, &callerDevice);
  std::vector<at::Tensor> outputs;
  try {
    outputs = executor_->forward(tensors, /*agreed=*/true);  // prepareStep agreed
  } catch (...) {
    rethrowWithContext();
  }
  // Note [The autograd bridge]: the caller's backward runs the pipeline backward.
  return pipelineOutputs(anchor_, model_, executor_, backend_->rank(), std::move(outputs),
                         callerDevice);
}

std::vector<at::Tensor> Module::trainStep(const std::vector<c10::IValue>& inputs, bool agreed) {
  c10::Device callerDevice = stageDevice_;
  std::vector<at::Tensor> tensors =
      prepareStep(inputs, core::PlanUsage::TrainStep, agreed, &callerDevice);
  try {
    return movedTo(executor_->trainStep(tensors, lossScale_, /*agreed=*/true), callerDevice);
  } catch (...) {
    rethrowWithContext();
  }
}

void Module::setLossScale(double scale) {
  staging::checkLossScale(scale, "setLossScale");
  lossScale_ = scale;
}

double Module::unscaleGradients(double scale) { return trainingExecutor().unscaleGradients(scale); }

void Module::rethrowWithContext() const { rethrowAt(whereOf(*executor_, backend_->rank())); }

c10::Device stageDeviceOf(const Placement& placement) {
  if (!placement.onCuda()) return c10::Device(c10::DeviceType::CPU);
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(placement.device.index));
}

std::vector<at::Tensor> agreeOnCall(comm::Backend& backend, const std::vector<c10::IValue>& inputs,
                                    const std::string& how, comm::StepStatus problem,
                                    const std::string& step) {
  std::vector<at::Tensor> tensors;
  std::string summary;
  if (problem.ok()) {
    try {
      tensors = tensorsOf(inputs);
      checkDevices(tensors);
      checkBatchDims(tensors);
      summary = inputSummary(tensors);
    } catch (...) {
      problem = comm::StepStatus::fromCurrentException();
    }
  }
  checkSameAcrossRanks(agreeOnHow(backend, step, problem, how, summary));
  return tensors;
}

std::vector<at::Tensor> Module::prepareStep(const std::vector<c10::IValue>& inputs,
                                            core::PlanUsage usage, bool agreed,
                                            c10::Device* callerDevice) {
  // Note [One agreement per call].
  std::vector<at::Tensor> tensors =
      agreed ? tensorsOf(inputs) : agreeOnCall(*backend_, inputs, callDescription(usage));
  // The caller's inputs may be on the CPU: the stages (and the trace) take them on theirs.
  if (!tensors.empty() && tensors[0].defined()) *callerDevice = tensors[0].device();
  tensors = movedTo(tensors, stageDevice_);
  const bool training = isTraining();
  if (training != importedTraining_ && (model_ || parked_.count(training)))
    switchMode(training, usage);  // also back to a parked mode after a failed import of the other
  if (!model_) {
    importFor(tensors);
  } else if (signatureOf(tensors, true) != tracedSignature_) {
    std::string given = signatureOf(tensors, true);
    if (!options_.allowReplan) {
      comm::throwAgreed("Error", "the inputs " + given + " differ from the traced inputs " +
                                     tracedSignature_ + " in dtype or in dims other than 0 "
                                     "(the batch); pass inputs of the traced dtypes and shapes, "
                                     "or set allow_replan=true to retrace and replan");
    }
    core::logger("Module")->info("Inputs changed from {} to {}: retracing and replanning "
                                 "(allow_replan=true)", tracedSignature_, given);
    // The new deployment starts from rank 0's tensors (ParamStorage::synchronize), which are
    // current only where rank 0 held them: share the holders' values first.
    if (executor_) shareState();
    parked_.clear();  // made for the old shapes (Note [Train and eval modes])
    trainingExecutor_.reset();  // trainingParams_ keeps its parameters for followTraining
    importFor(tensors);
  }
  switchTo(usage, tensors);
  checkBatchFits(tensors[0].size(0));
  return tensors;
}

void Module::importFor(const std::vector<at::Tensor>& inputs) {
  executor_.reset();
  executors_.clear();
  auto log = core::logger("Module");
  importedTraining_ = isTraining();
  log->info("Tracing model ...");
  std::vector<c10::IValue> examples = examplesOn(inputs, stageDevice_);
  comm::runAgreed(*backend_, "tracing and importing the model", [&] { importModel(examples); });
  log->info("Model graph: {} nodes, {} parameter tensors", model_->graph.nodeCount(),
            model_->paramTensors.size());
  tracedSignature_ = signatureOf(inputs, true);
}

// Note [Train and eval modes].
void Module::switchMode(bool training, core::PlanUsage usage) {
  auto parked = parked_.find(training);
  const bool known = parked != parked_.end();
  core::logger("Module")->info("Switching from {} to {} mode: {}",
                               importedTraining_ ? "train" : "eval", training ? "train" : "eval",
                               known ? "using its deployment" : "tracing and planning it (once)");
  if (executor_) {
    const Executor* next = nullptr;
    if (known) {
      auto found = parked->second.executors.find(usage);
      if (found != parked->second.executors.end()) next = found->second.get();
    }
    shareStateFor(next);
  }
  if (model_) {  // none when this mode's import failed
    parked_[importedTraining_] =
        ParkedImport{std::move(model_), std::move(executors_), executor_, tracedSignature_};
  }
  if (known) {
    model_ = std::move(parked->second.model);
    executors_ = std::move(parked->second.executors);
    executor_ = parked->second.last;
    tracedSignature_ = parked->second.tracedSignature;
    parked_.erase(parked);
  } else {
    model_.reset();
    executors_.clear();
    executor_.reset();
    tracedSignature_.clear();
  }
  importedTraining_ = training;
}

std::string Module::callDescription(core::PlanUsage usage) const {
  std::string how = usage == core::PlanUsage::TrainStep ? "trainStep" : "forward";
  if (!options_.tracer) how += module_.is_training() ? ", train mode" : ", eval mode";
  if (!at::GradMode::is_enabled()) how += ", no_grad";
  return how;
}

void Module::train(bool on) {
  if (options_.tracer) {  // the tracer's model is in this mode (its caller says so)
    tracerTraining_ = on;
    return;
  }
  for (const torch::jit::Module& m : module_.modules()) {
    AUTOSTAGE_CHECK_AS(UnsupportedError, m.type()->hasAttribute("training"),
                       m.type()->name() ? m.type()->name()->qualifiedName() : "a submodule",
                       " has no 'training' attribute, so the module has no train/eval modes "
                       "(a jit::Module built in C++ gets one with register_attribute(\"training\", "
                       "c10::BoolType::get(), true); scripted and traced modules have it)");
  }
  module_.train(on);
}

// Note [One deployment per usage].
void Module::switchTo(core::PlanUsage usage, const std::vector<at::Tensor>& inputs) {
  auto found = executors_.find(usage);
  if (executor_ && (found == executors_.end() || found->second != executor_)) {
    core::logger("Module")->info("Switching from {} to {}: {}", core::usageName(this->usage()),
                                 core::usageName(usage), found == executors_.end()
                                     ? "planning it (once)" : "using its deployment");
    shareStateFor(found == executors_.end() ? nullptr : found->second.get());
  }
  if (found == executors_.end()) {
    deploy(inputs, usage);
  } else {
    executor_ = found->second;
    executor_->sliceHeldParameters();  // cut again after a switch joined them
    noteSlicesOf(*executor_);
  }
  if (usage != core::PlanUsage::Inference) followTraining(executor_);
}

void Module::followTraining(const std::shared_ptr<Executor>& executor) {
  if (executor == trainingExecutor_) return;
  if (trainingSelection_ > 0) {
    // Gradients live on the holders: those of parameters the previous training deployment did
    // not give this rank are stale (a zero_grad() over its parameters did not reach them).
    for (const at::Tensor& p : model_->paramTensors) {
      bool mine = std::any_of(trainingParams_.begin(), trainingParams_.end(),
                              [&](const at::Tensor& h) { return h.is_same(p); });
      if (!mine && p.requires_grad() && p.grad().defined()) p.mutable_grad() = at::Tensor();
    }
  }
  trainingExecutor_ = executor;
  trainingParams_ = executor->params().parameters();
  ++trainingSelection_;
}

// On failure the deployment that ran last stays current (Note [Bad input on one rank]).
void Module::deploy(const std::vector<at::Tensor>& inputs, core::PlanUsage usage) {
  std::vector<c10::IValue> examples = examplesOn(inputs, stageDevice_);
  int64_t globalBatch = inputs[0].size(0) * backend_->worldSize();
  staging::VerifiedDeployment deployment = obtainDeployment(examples, globalBatch, usage);
  ExecutorOptions executorOptions;
  executorOptions.device = stageDevice_;
  executorOptions.gradientBucketBytes = options_.gradientBucketBytes;
  executorOptions.traceDirectory = options_.traceDirectory;
  executorOptions.traceSteps = options_.traceSteps;
  executorOptions.precision = options_.precision;
  executorOptions.memoryMeter = options_.memoryMeter;
  executor_ = std::make_shared<Executor>(*model_, std::move(deployment), backend_,
                                         executorOptions);
  executors_[usage] = executor_;
  noteSlicesOf(*executor_);
  executor_->setOptimizerStateBytes(usage == core::PlanUsage::Inference ? 0 : optimizerStateBytes_);
  ++deploymentCount_;
  std::string stages;
  for (int stage : executor_->localStages()) stages += (stages.empty() ? "" : ",") + std::to_string(stage);
  core::logger("Runtime")->info("Deployed stage{} {} on rank {} ({} local parameter tensors)",
                                stages.find(',') != std::string::npos ? "s" : "",
                                stages.empty() ? "-1" : stages, backend_->rank(),
                                executor_->params().ids().size());
  core::logger("Module")->info("Module is ready. (rank{})", backend_->rank());
}

void Module::importModel(const std::vector<c10::IValue>& examples) {
  model_.reset();
  // One import serves every usage (Note [One deployment per usage]): trace with gradients even
  // when the first call runs under no_grad, so the graph records which values carry gradients
  // (routes carry them back) and has the same hash whatever the first call was.
  at::AutoGradMode withGradients(true);
  if (options_.tracer) {
    CapturedModel captured = options_.tracer(examples);  // without autocast, on the stages' device
    if (captured.imported) {
      std::vector<std::pair<std::string, at::Tensor>> tensors;
      for (size_t i = 0; i < captured.imported->paramTensors.size(); ++i)
        tensors.emplace_back(captured.imported->paramNames[i], captured.imported->paramTensors[i]);
      driver::placeTensors(tensors, stageDevice_);
      std::vector<c10::IValue> probeInputs;  // copies: the probe runs in-place updates too
      for (const c10::IValue& v : examples) probeInputs.push_back(v.toTensor().clone());
      for (const at::Tensor& t : captured.imported->paramTensors)
        probeInputs.push_back(t.detach().clone().requires_grad_(t.requires_grad()));
      // As the TorchScript import's probe: the dtypes the stages produce under their autocast.
      torchscript::AutocastGuard autocast(options_.precision, stageDevice_.type());
      exportfe::recordTypes(captured.imported->graph, std::move(probeInputs));
      model_ = std::move(captured.imported);
      logCapture();
      return;
    }
    module_ = captured.script;
    // The tracer's caller placed the model before (autostage.Module does); check what it gave.
    driver::placeTensors(stateTensorsOf(module_), stageDevice_);
  }
  // The import probe runs under the stages' autocast, so the IR records the dtypes the stages
  // produce and routes carry (Note [Autocast execution]).
  torchscript::AutocastGuard autocast(options_.precision, stageDevice_.type());
  model_ = std::make_shared<torchscript::ImportedModel>(
      torchscript::importModule(module_, examples));
  logCapture();
}

void Module::logCapture() const {
  if (backend_->rank() != 0) return;
  core::logger("Module")->info("Captured {} with {}: {} nodes, {} parameter/buffer tensors",
                               model_->graph.name(), model_->frontEnd, model_->graph.nodeCount(),
                               model_->paramTensors.size());
}

// Runs on every rank with the same (agreed) local batch, so the error needs no exchange.
void Module::checkBatchFits(int64_t localBatch) const {
  const core::Deployment& d = executor_->deployment();
  try {
    BatchLayout layout(localBatch, backend_->worldSize(), d.microBatchCount);
    for (const core::StageDeployment& stage : d.stages)
      layout.checkReplicaCount(stage.replicaCount(), stage.name);
  } catch (const Error& e) {
    comm::throwAgreed("Error", std::string("the batch is too small for the deployment: ") +
                                   e.what());
  }
}

std::vector<at::Tensor> Module::parameters() const {
  return trainingExecutor_ ? trainingExecutor_->params().parameters() : std::vector<at::Tensor>();
}

std::vector<std::pair<std::string, at::Tensor>> Module::namedParameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (!trainingExecutor_) return out;
  for (auto& [name, t] : trainingExecutor_->params().namedTensors())
    if (t.requires_grad()) out.emplace_back(name, t);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Module::stateDict() {
  AUTOSTAGE_CHECK(executor_ != nullptr, "state_dict of a module that is not deployed yet: the "
                  "module's own state_dict is current until its first forward call");
  agreeOnHow(*backend_, "state_dict", {}, "state_dict()", "");  // Note [Calls in different modes]
  return gatherState(*model_, executor_->deployment(), *backend_, slicedNow_);
}

void Module::loadStateDict(const std::vector<std::pair<std::string, at::Tensor>>& state,
                           bool strict) {
  staging::loadStateDict(module_, sliceState(state), strict);
}

std::vector<std::pair<std::string, at::Tensor>> Module::sliceState(
    std::vector<std::pair<std::string, at::Tensor>> state) const {
  if (!executor_ || !executor_->slicesHeld()) return state;
  for (const staging::Executor::HeldSlice& slice : executor_->heldSlices())
    for (auto& [name, tensor] : state)
      if (name == slice.name && tensor.sizes().vec() == slice.whole)
        tensor = staging::shardTensor(tensor, slice.shard, slice.degree, slice.index);
  return state;
}

void Module::shareState() { shareStateFor(nullptr); }

void Module::shareStateFor(const Executor* next) {
  AUTOSTAGE_CHECK(executor_ != nullptr, "shareState of a module that is not deployed yet");
  // Note [Sharing sliced parameters] and Note [Keeping slices across a switch] in
  // staging/checkpoint.cpp: what every rank knows alike (the deployments), not tensor shapes.
  std::set<std::string> keep;
  if (next) {
    const staging::SliceLayouts& nextSlices = next->sliceLayouts();
    for (const auto& [name, layout] : slicedNow_) {
      auto there = nextSlices.find(name);
      if (there != nextSlices.end() && there->second == layout) keep.insert(name);
    }
  }
  staging::shareState(*model_, executor_->deployment(), *backend_, slicedNow_, keep);
  for (auto it = slicedNow_.begin(); it != slicedNow_.end();)
    it = keep.count(it->first) ? std::next(it) : slicedNow_.erase(it);
  executor_->slicesJoined();
}

void Module::noteSlicesOf(const Executor& executor) {
  slicedNow_ = executor.slicesHeld() ? executor.sliceLayouts() : staging::SliceLayouts{};
}

const core::Deployment& Module::deployment() const {
  AUTOSTAGE_CHECK(executor_ != nullptr, "the module is deployed on its first forward call");
  return executor_->deployment();
}

Executor& Module::executor() {
  AUTOSTAGE_CHECK(executor_ != nullptr, "the module is deployed on its first forward call");
  return *executor_;
}

void Module::setOptimizerStateBytes(int64_t bytes) {
  optimizerStateBytes_ = bytes;
  for (auto& [usage, executor] : executors_)
    executor->setOptimizerStateBytes(usage == core::PlanUsage::Inference ? 0 : bytes);
  for (auto& [mode, parked] : parked_)
    for (auto& [usage, executor] : parked.executors)
      executor->setOptimizerStateBytes(usage == core::PlanUsage::Inference ? 0 : bytes);
}

Executor& Module::trainingExecutor() {
  AUTOSTAGE_CHECK(trainingExecutor_ != nullptr, "the module has no training deployment yet: it is "
                  "made on the first forward with gradients enabled (or train_step); forwards "
                  "under no_grad run an inference deployment, which has no gradients");
  return *trainingExecutor_;
}

core::PlanUsage Module::usage() const {
  AUTOSTAGE_CHECK(executor_ != nullptr, "the module is deployed on its first forward call");
  for (const auto& [usage, executor] : executors_)
    if (executor == executor_) return usage;
  AUTOSTAGE_INTERNAL_ASSERT(false, "the current deployment is not among the module's usages");
  return core::PlanUsage::TrainStep;
}

}  // namespace autostage::driver
