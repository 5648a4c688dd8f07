#include "staging/module.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "comm/agreement.h"
#include "comm/registry.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/proto/deployment_file.h"
#include "core/torchscript/autocast.h"
#include "staging/call_inputs.h"
#include "staging/checkpoint.h"
#include "staging/plan_cache.h"
#include "staging/route_check.h"
#include "staging/sample_range.h"
#include "staging/state_dict_load.h"

namespace autostage::staging {
namespace {

// "rank 2, stage 1 (STAGE_3_5)" or "rank 2 (no stage)".
std::string whereOf(const Executor& executor, int rank) {
  std::ostringstream out;
  out << "rank " << rank;
  int stage = executor.localStage();
  if (stage < 0) return out.str() + " (no stage)";
  out << ", stage " << stage << " (" << executor.deployment().stages[stage].name << ")";
  return out.str();
}

// The TorchScript interpreter wraps an op's error in a script traceback of the generated stage
// graph, which names no user code; its last line ("RuntimeError: index out of range in self")
// is the part worth reporting.
std::string withoutScriptTraceback(const std::string& message) {
  if (message.find("failed in the TorchScript interpreter") == std::string::npos) return message;
  size_t end = message.find_last_not_of("\n ");
  if (end == std::string::npos) return message;
  size_t begin = message.rfind('\n', end);
  begin = begin == std::string::npos ? 0 : begin + 1;
  return message.substr(begin, end + 1 - begin) + " (in the TorchScript interpreter)";
}

// Rethrows the exception being handled, same autostage class, with `where` in front.
[[noreturn]] void rethrowAt(const std::string& where) {
  comm::StepStatus status = comm::StepStatus::fromCurrentException();
  comm::throwErrorOfClass(status.errorClass,
                          where + ": " + withoutScriptTraceback(status.message));
}

// Keeps the executor of one forward alive until its backward has run.
struct PipelineStep : torch::CustomClassHolder {
  std::shared_ptr<Executor> executor;
  int rank = 0;
  std::vector<at::Tensor> outputs;
};

// The autograd node behind Module::forward's outputs: its backward is the pipeline backward.
struct PipelineFunction : public torch::autograd::Function<PipelineFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& anchor,
                                                c10::intrusive_ptr<PipelineStep> step) {
    ctx->saved_data["step"] = c10::IValue::make_capsule(step);
    return step->outputs;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto step = c10::static_intrusive_pointer_cast<PipelineStep>(
        ctx->saved_data["step"].toCapsule());
    try {
      step->executor->backward(grads);
    } catch (...) {
      rethrowAt(whereOf(*step->executor, step->rank));
    }
    return {at::Tensor(), at::Tensor()};
  }
};

// Note [Plan usage]: a deployment (a loaded one may have been planned for another API) must run
// the schedule the call runs and budget what it holds.
void checkRunsAs(const core::Deployment& d, core::PlanUsage usage) {
  auto recorded = d.options.find(core::kUsageOption);
  const std::string planned = recorded == d.options.end() ? "" : recorded->second;
  const std::string wanted = core::usageName(usage);
  const char* api = usage == core::PlanUsage::TrainStep ? "train_step" : "forward()";
  AUTOSTAGE_CHECK_AS(ConfigError,
                     usage == core::PlanUsage::TrainStep || d.schedule == "gpipe",
                     "the deployment runs schedule ", d.schedule, ", which forward() cannot run "
                     "(it runs every micro-batch's forward before any backward: gpipe); run it "
                     "with train_step(...) and a model returning its loss, use a deployment "
                     "planned for ", wanted, ", or plan again (drop load_deployment)");
  AUTOSTAGE_CHECK_AS(ConfigError,
                     usage == core::PlanUsage::Inference ||
                         planned != core::usageName(core::PlanUsage::Inference),
                     "the deployment was planned for inference (no gradients, no optimizer "
                     "state, no activations kept) but this call (", api, " with gradients) trains;"
                     " use a deployment planned for ", wanted, ", or plan again (drop "
                     "load_deployment)");
}

void logDeployment(const core::Deployment& d) {
  auto log = core::logger("DPStaging");
  auto usage = d.options.find(core::kUsageOption);
  log->info("Deployment: {} stage(s), {} micro-batch(es), schedule {}, world size {}, for {}",
            d.stages.size(), d.microBatchCount, d.schedule, d.worldSize,
            usage == d.options.end() ? std::string("(usage not recorded)") : usage->second);
  for (const core::StageDeployment& s : d.stages) {
    std::ostringstream ranks;
    for (size_t i = 0; i < s.ranks.size(); ++i) ranks << (i ? "," : "") << s.ranks[i];
    log->info("{}: {} nodes, replicas={} ranks={{{}}} recompute={}", s.name, s.nodes.size(),
              s.replicaCount(), ranks.str(), s.recompute);
  }
}

}  // namespace

ModuleOptions ModuleOptions::fromConfig() {
  const core::Config& config = core::globalConfig();
  ModuleOptions options;
  options.allowReplan = config.getBool("allow_replan");
  if (config.getBool("trace_events")) options.traceDirectory = config.getString("trace_events_dir");
  options.traceSteps = static_cast<int>(config.getInt("trace_events_steps"));
  const std::string file = config.getString("deployment_file");
  const int64_t dryRun = config.getInt("partitioning_dry_run_np");
  const bool load = config.getBool("load_deployment"), save = config.getBool("save_deployment");
  const char* what = dryRun > 0 ? "partitioning_dry_run_np" : load ? "load_deployment=true"
                                                            : "save_deployment=true";
  AUTOSTAGE_CHECK_AS(ConfigError, !file.empty() || (dryRun <= 0 && !load && !save), what,
                     " needs deployment_file: set deployment_file to the path of the deployment "
                     "to ", load && dryRun <= 0 ? "load" : "write");
  AUTOSTAGE_CHECK_AS(ConfigError, dryRun >= 0 && dryRun <= (1 << 20),
                     "partitioning_dry_run_np must be 0 (off) or the number of ranks to plan "
                     "for, got ", dryRun);
  AUTOSTAGE_CHECK_AS(ConfigError, !(load && dryRun > 0),
                     "partitioning_dry_run_np plans and saves a deployment, load_deployment=true "
                     "loads one: set only one of them");
  if (load) options.deploymentPath = file;
  if (save || dryRun > 0) options.saveDeploymentPath = file;
  options.dryRunWorldSize = static_cast<int>(dryRun);
  options.precision = core::parsePrecision(config.getString("precision"));
  options.gradientBucketBytes = config.getInt("gradient_bucket_bytes");
  return options;
}

void ModuleOptions::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError, planner || !deploymentPath.empty(),
                     "autostage::Module needs a planner callback or a deployment path; set "
                     "ModuleOptions::planner or ModuleOptions::deploymentPath");
  AUTOSTAGE_CHECK_AS(ConfigError, dryRunWorldSize <= 0 || (planner && !saveDeploymentPath.empty()),
                     "a dry run (partitioning_dry_run_np) needs a planner and a path to save "
                     "the deployment to (deployment_file)");
  AUTOSTAGE_CHECK_AS(ConfigError, gradientBucketBytes >= 1,
                     "gradient_bucket_bytes must be >= 1, got ", gradientBucketBytes);
}

std::string ModuleOptions::toString() const {
  std::ostringstream out;
  out << "backend=" << (backend ? backend->name() : std::string("mpi"))
      << " planner=" << (planner ? "callback" : "none") << " tracer="
      << (tracer ? "callback" : "none") << " deployment_path='" << deploymentPath
      << "' gradient_bucket_bytes=" << gradientBucketBytes
      << " allow_replan=" << (allowReplan ? "true" : "false") << " save_deployment_path='"
      << saveDeploymentPath << "' dry_run_world_size=" << dryRunWorldSize
      << " device_memory=" << deviceMemory << " precision=" << core::precisionName(precision);
  return out.str();
}

Module::Module(torch::jit::Module module, ModuleOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  options_.validate();
  if (options_.backend) {
    backend_ = options_.backend;
  } else {
    comm::registerBuiltinBackends();
    backend_ = comm::sharedBackend("mpi");
  }
  // Stages run on CPU tensors unless the backend is NCCL (CUDA): fp16 autocast needs CUDA.
  stageDevice_ = backend_->name() == "nccl" ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  torchscript::checkAutocastSupported(options_.precision, stageDevice_);
  anchor_ = at::zeros({}, at::kFloat).requires_grad_(true);
  core::logger("Module")->debug("options: {}", options_.toString());
}

Module::~Module() = default;

std::vector<at::Tensor> Module::forward(const std::vector<c10::IValue>& inputs) {
  const core::PlanUsage usage = at::GradMode::is_enabled() ? core::PlanUsage::ForwardBackward
                                                           : core::PlanUsage::Inference;
  std::vector<at::Tensor> tensors = prepareStep(inputs, usage);
  auto step = c10::make_intrusive<PipelineStep>();
  step->executor = executor_;
  step->rank = backend_->rank();
  try {
    step->outputs = executor_->forward(tensors);
  } catch (...) {
    rethrowWithContext();
  }
  std::vector<at::Tensor> outputs = PipelineFunction::apply(anchor_, step);
  step->outputs.clear();  // the outputs hold the autograd node that holds `step`: no cycle
  return outputs;
}

std::vector<at::Tensor> Module::trainStep(const std::vector<c10::IValue>& inputs) {
  std::vector<at::Tensor> tensors = prepareStep(inputs, core::PlanUsage::TrainStep);
  try {
    return executor_->trainStep(tensors);
  } catch (...) {
    rethrowWithContext();
  }
}

void Module::rethrowWithContext() const { rethrowAt(whereOf(*executor_, backend_->rank())); }

std::vector<at::Tensor> Module::prepareStep(const std::vector<c10::IValue>& inputs,
                                            core::PlanUsage usage) {
  std::vector<at::Tensor> tensors;
  comm::StepStatus local;
  std::string summary;
  try {
    tensors = tensorsOf(inputs);
    checkDevices(tensors, stageDevice_);
    checkBatchDims(tensors);
    summary = inputSummary(tensors);
  } catch (...) {
    local = comm::StepStatus::fromCurrentException();
  }
  checkSameAcrossRanks(comm::agreeAndGather(*backend_, "checking the inputs", local, summary));
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
    importFor(tensors);
  }
  switchTo(usage, tensors);
  checkBatchFits(tensors[0].size(0));
  return tensors;
}

void Module::importFor(const std::vector<at::Tensor>& inputs) {
  executor_.reset();
  trainingExecutor_.reset();  // trainingParams_ keeps its parameters for followTraining
  executors_.clear();
  auto log = core::logger("Module");
  log->info("Tracing model ...");
  std::vector<c10::IValue> examples(inputs.begin(), inputs.end());
  comm::runAgreed(*backend_, "tracing and importing the model", [&] { importModel(examples); });
  log->info("Model graph: {} nodes, {} parameter tensors", model_->graph.nodeCount(),
            model_->paramTensors.size());
  tracedSignature_ = signatureOf(inputs, true);
}

// Note [One deployment per usage].
void Module::switchTo(core::PlanUsage usage, const std::vector<at::Tensor>& inputs) {
  auto found = executors_.find(usage);
  if (executor_ && (found == executors_.end() || found->second != executor_)) {
    core::logger("Module")->info("Switching from {} to {}: {}", core::usageName(this->usage()),
                                 core::usageName(usage), found == executors_.end()
                                     ? "planning it (once)" : "using its deployment");
    shareState();
  }
  if (found == executors_.end()) {
    deploy(inputs, usage);
  } else {
    executor_ = found->second;
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
  std::vector<c10::IValue> examples(inputs.begin(), inputs.end());
  int64_t globalBatch = inputs[0].size(0) * backend_->worldSize();
  core::Deployment deployment = obtainDeployment(examples, globalBatch, usage);
  if (backend_->rank() == 0) logDeployment(deployment);
  comm::runAgreed(*backend_, "validating the deployment",
                  [&] { validateDeployment(deployment, globalBatch, usage); });
  core::logger("DPStaging")->info("Routes verification passed.");
  ExecutorOptions executorOptions;
  executorOptions.gradientBucketBytes = options_.gradientBucketBytes;
  executorOptions.traceDirectory = options_.traceDirectory;
  executorOptions.traceSteps = options_.traceSteps;
  executorOptions.precision = options_.precision;
  executorOptions.memoryMeter = options_.memoryMeter;
  executor_ = std::make_shared<Executor>(*model_, std::move(deployment), backend_,
                                         executorOptions);
  executors_[usage] = executor_;
  executor_->setOptimizerStateBytes(usage == core::PlanUsage::Inference ? 0 : optimizerStateBytes_);
  ++deploymentCount_;
  core::logger("Runtime")->info("Deployed stage {} on rank {} ({} local parameter tensors)",
                                executor_->localStage(), backend_->rank(),
                                executor_->params().ids().size());
  core::logger("Module")->info("Module is ready. (rank{})", backend_->rank());
}

void Module::importModel(const std::vector<c10::IValue>& examples) {
  model_.reset();
  // One import serves every usage (Note [One deployment per usage]): trace with gradients even
  // when the first call runs under no_grad, so the graph records which values carry gradients
  // (routes carry them back) and has the same hash whatever the first call was.
  at::AutoGradMode withGradients(true);
  if (options_.tracer) module_ = options_.tracer(examples);  // traced without autocast
  // The import probe runs under the stages' autocast, so the IR records the dtypes the stages
  // produce and routes carry (Note [Autocast execution]).
  torchscript::AutocastGuard autocast(options_.precision);
  model_ = std::make_unique<torchscript::ImportedModel>(
      torchscript::importModule(module_, examples));
}

core::Deployment Module::obtainDeployment(const std::vector<c10::IValue>& examples,
                                          int64_t globalBatch, core::PlanUsage usage) {
  core::Deployment deployment;
  // A saved deployment is for the first usage this module runs (Note [One deployment per usage]).
  if (!options_.deploymentPath.empty() && deploymentCount_ == 0) {
    core::logger("Module")->info("Loading deployment from {}", options_.deploymentPath);
    comm::runAgreed(*backend_, "loading the saved deployment",
                    [&] { deployment = core::loadDeployment(options_.deploymentPath); });
    return deployment;
  }
  if (options_.dryRunWorldSize > 0) {
    comm::runAgreed(*backend_, "planning (dry run)", [&] {
      if (backend_->rank() == 0) planDryRun(examples, globalBatch, usage);
    });
    const std::string message =
        "The dry run for partitioning finished: the deployment for " +
        std::to_string(options_.dryRunWorldSize) + " ranks is in " + options_.saveDeploymentPath +
        "; launch " + std::to_string(options_.dryRunWorldSize) +
        " ranks with load_deployment=true and deployment_file=" + options_.saveDeploymentPath;
    if (backend_->rank() == 0) core::logger("DPStaging")->info("{}. Exiting ...", message);
    throw DryRunFinished(message);
  }
  std::string bytes;
  comm::runAgreed(*backend_, "planning", [&] {
    if (backend_->rank() != 0) return;
    const std::string cached = planCachePath(model_->graph.hash(), backend_->worldSize(),
                                             globalBatch, usage);
    if (!cached.empty() && readCachedPlan(cached, &bytes)) return;
    core::logger("DPStaging")->info("Planning on rank 0 for {} (world size {}, batch size {}) ...",
                                    core::usageName(usage), backend_->worldSize(), globalBatch);
    PlanningInput input{*model_, examples, backend_->worldSize(), globalBatch};
    input.usage = usage;
    core::Deployment planned = options_.planner(input);
    bytes = core::encodeDeployment(planned);
    if (!cached.empty()) writeCachedPlan(planned, cached);
    if (!options_.saveDeploymentPath.empty()) {
      core::saveDeployment(planned, options_.saveDeploymentPath);
      core::logger("DPStaging")->info("Saved the deployment to {} (save_deployment)",
                                      options_.saveDeploymentPath);
    }
  });
  if (backend_->worldSize() > 1) backend_->broadcastBytes(bytes, 0, backend_->world());
  return core::decodeDeployment(bytes, "deployment broadcast from rank 0");
}

// Note [Saved deployments]. The global batch of a dry run is what the later job on
// dryRunWorldSize ranks will feed: this rank's local batch times that many ranks.
void Module::planDryRun(const std::vector<c10::IValue>& examples, int64_t globalBatch,
                        core::PlanUsage usage) {
  const int ranks = options_.dryRunWorldSize;
  const int64_t batch = globalBatch / backend_->worldSize() * ranks;
  core::logger("DPStaging")->info("Starting dry run of partitioning for {} ranks on {} rank(s) "
                                  "(batch size {}) ...", ranks, backend_->worldSize(), batch);
  PlanningInput input{*model_, examples, ranks, batch};
  input.devicesPerNode = ranks;
  input.usage = usage;
  core::Deployment planned = options_.planner(input);
  verifyRoutes(model_->graph, planned);
  logDeployment(planned);
  core::saveDeployment(planned, options_.saveDeploymentPath);
  core::logger("DPStaging")->info("Saved the deployment to {}", options_.saveDeploymentPath);
}

// Note [Bad input on one rank]: checks that would otherwise fail inside the executor's
// collective construction, each naming the deployment field that does not fit this job
// (Note [Saved deployments]).
void Module::validateDeployment(const core::Deployment& deployment, int64_t globalBatch,
                                core::PlanUsage usage) const {
  AUTOSTAGE_CHECK_AS(ConfigError, deployment.worldSize == backend_->worldSize(),
                     "deployment field world_size is ", deployment.worldSize, " but this job has ",
                     backend_->worldSize(), " ranks; launch with ", deployment.worldSize,
                     " ranks, or plan again for this world size (drop load_deployment)");
  // A planner callback plans for this graph; a saved deployment may be for another one.
  bool loaded = !options_.deploymentPath.empty();
  AUTOSTAGE_CHECK_AS(ConfigError, !loaded || deployment.batchSize == globalBatch,
                     "deployment field batch_size is ", deployment.batchSize,
                     " but this job's global batch is ", globalBatch, " (", backend_->worldSize(),
                     " ranks x ", globalBatch / backend_->worldSize(), "); pass local batches of ",
                     deployment.batchSize / std::max(1, deployment.worldSize),
                     " samples, or plan again for this batch (drop load_deployment)");
  AUTOSTAGE_CHECK_AS(ConfigError, !loaded || options_.deviceMemory <= 0 ||
                         deployment.deviceMemory <= options_.deviceMemory,
                     "deployment field device_memory is ", deployment.deviceMemory,
                     " bytes but this job's devices have ", options_.deviceMemory,
                     " bytes (mem_limit_gb, or this node's memory shared by its ranks), so the "
                     "plan might not fit; set mem_limit_gb to at least ",
                     static_cast<double>(deployment.deviceMemory) / (1 << 30),
                     " if the devices really have that much, or plan again (drop load_deployment)");
  AUTOSTAGE_CHECK_AS(FormatError, !loaded || deployment.graphHash == model_->graph.hash(),
                     "deployment field graph_hash is ", deployment.graphHash,
                     " but the traced model's graph hash is ", model_->graph.hash(),
                     "; the deployment was planned for a different model or input shape: load "
                     "the deployment saved for this model, or plan again (drop load_deployment)");
  checkRunsAs(deployment, usage);
  verifyRoutes(model_->graph, deployment);
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
  return gatherState(*model_, executor_->deployment(), *backend_);
}

void Module::loadStateDict(const std::vector<std::pair<std::string, at::Tensor>>& state,
                           bool strict) {
  staging::loadStateDict(module_, state, strict);
}

void Module::shareState() {
  AUTOSTAGE_CHECK(executor_ != nullptr, "shareState of a module that is not deployed yet");
  staging::shareState(*model_, executor_->deployment(), *backend_);
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

}  // namespace autostage::staging
