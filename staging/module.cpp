#include "staging/module.h"

#include <cstring>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "comm/registry.h"
#include "core/error.h"
#include "core/log.h"
#include "core/proto/deployment_file.h"
#include "staging/route_check.h"

namespace autostage::staging {
namespace {

constexpr const char* kPlanErrorPrefix = "autostage-plan-error:";

// Keeps the executor of one forward alive until its backward has run.
struct PipelineStep : torch::CustomClassHolder {
  std::shared_ptr<Executor> executor;
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
    step->executor->backward(grads);
    return {at::Tensor(), at::Tensor()};
  }
};

std::vector<at::Tensor> tensorsOf(const std::vector<c10::IValue>& inputs) {
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < inputs.size(); ++i) {
    AUTOSTAGE_CHECK_AS(UnsupportedError, inputs[i].isTensor(), "input ", i, " is a ",
                       inputs[i].tagKind(), "; autostage::Module takes tensors with the batch in "
                       "dim 0 as forward arguments");
    tensors.push_back(inputs[i].toTensor());
  }
  return tensors;
}

void logDeployment(const core::Deployment& d) {
  auto log = core::logger("DPStaging");
  log->info("Deployment: {} stage(s), {} micro-batch(es), schedule {}, world size {}",
            d.stages.size(), d.microBatchCount, d.schedule, d.worldSize);
  for (const core::StageDeployment& s : d.stages) {
    std::ostringstream ranks;
    for (size_t i = 0; i < s.ranks.size(); ++i) ranks << (i ? "," : "") << s.ranks[i];
    log->info("{}: {} nodes, replicas={} ranks={{{}}} recompute={}", s.name, s.nodes.size(),
              s.replicaCount(), ranks.str(), s.recompute);
  }
}

}  // namespace

void ModuleOptions::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError, planner || !deploymentPath.empty(),
                     "autostage::Module needs a planner callback or a deployment path; set "
                     "ModuleOptions::planner or ModuleOptions::deploymentPath");
  AUTOSTAGE_CHECK_AS(ConfigError, gradientBucketBytes >= 1,
                     "gradient_bucket_bytes must be >= 1, got ", gradientBucketBytes);
}

std::string ModuleOptions::toString() const {
  std::ostringstream out;
  out << "backend=" << (backend ? backend->name() : std::string("mpi"))
      << " planner=" << (planner ? "callback" : "none") << " deployment_path='"
      << deploymentPath << "' gradient_bucket_bytes=" << gradientBucketBytes;
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
  anchor_ = at::zeros({}, at::kFloat).requires_grad_(true);
  core::logger("Module")->debug("options: {}", options_.toString());
}

Module::~Module() = default;

std::vector<at::Tensor> Module::forward(const std::vector<c10::IValue>& inputs) {
  std::vector<at::Tensor> tensors = tensorsOf(inputs);
  deployOnFirstCall(tensors);
  auto step = c10::make_intrusive<PipelineStep>();
  step->executor = executor_;
  step->outputs = executor_->forward(tensors);
  std::vector<at::Tensor> outputs = PipelineFunction::apply(anchor_, step);
  step->outputs.clear();  // the outputs hold the autograd node that holds `step`: no cycle
  return outputs;
}

std::vector<at::Tensor> Module::trainStep(const std::vector<c10::IValue>& inputs) {
  std::vector<at::Tensor> tensors = tensorsOf(inputs);
  deployOnFirstCall(tensors);
  return executor_->trainStep(tensors);
}

void Module::deployOnFirstCall(const std::vector<at::Tensor>& inputs) {
  if (executor_) return;
  auto log = core::logger("Module");
  log->info("Tracing model ...");
  std::vector<c10::IValue> examples(inputs.begin(), inputs.end());
  model_ = std::make_unique<torchscript::ImportedModel>(
      torchscript::importModule(module_, examples));
  log->info("Model graph: {} nodes, {} parameter tensors", model_->graph.nodeCount(),
            model_->paramTensors.size());
  int64_t local = inputs.empty() || inputs[0].dim() < 1 ? 0 : inputs[0].size(0);
  core::Deployment deployment = obtainDeployment(examples, local * backend_->worldSize());
  if (backend_->rank() == 0) logDeployment(deployment);
  verifyRoutes(model_->graph, deployment);
  core::logger("DPStaging")->info("Routes verification passed.");
  ExecutorOptions executorOptions;
  executorOptions.gradientBucketBytes = options_.gradientBucketBytes;
  executor_ = std::make_shared<Executor>(*model_, std::move(deployment), backend_,
                                         executorOptions);
  core::logger("Runtime")->info("Deployed stage {} on rank {} ({} local parameter tensors)",
                                executor_->localStage(), backend_->rank(),
                                executor_->params().ids().size());
  log->info("Module is ready. (rank{})", backend_->rank());
}

core::Deployment Module::obtainDeployment(const std::vector<c10::IValue>& examples,
                                          int64_t globalBatch) {
  if (!options_.deploymentPath.empty()) {
    core::logger("Module")->info("Loading deployment from {}", options_.deploymentPath);
    return core::loadDeployment(options_.deploymentPath);
  }
  std::string bytes;
  if (backend_->rank() == 0) {
    core::logger("DPStaging")->info("Planning on rank 0 (world size {}, batch size {}) ...",
                                    backend_->worldSize(), globalBatch);
    try {
      bytes = core::encodeDeployment(
          options_.planner({*model_, examples, backend_->worldSize(), globalBatch}));
    } catch (const std::exception& e) {
      bytes = std::string(kPlanErrorPrefix) + e.what();
    }
  }
  if (backend_->worldSize() > 1) backend_->broadcastBytes(bytes, 0, backend_->world());
  AUTOSTAGE_CHECK_AS(PlanError, bytes.rfind(kPlanErrorPrefix, 0) != 0,
                     "planning on rank 0 failed: ", bytes.substr(std::strlen(kPlanErrorPrefix)));
  return core::decodeDeployment(bytes, "deployment broadcast from rank 0");
}

std::vector<at::Tensor> Module::parameters() const {
  return executor_ ? executor_->params().parameters() : std::vector<at::Tensor>();
}

std::vector<std::pair<std::string, at::Tensor>> Module::namedParameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (!executor_) return out;
  for (auto& [name, t] : executor_->params().namedTensors())
    if (t.requires_grad()) out.emplace_back(name, t);
  return out;
}

const core::Deployment& Module::deployment() const {
  AUTOSTAGE_CHECK(executor_ != nullptr, "the module is deployed on its first forward call");
  return executor_->deployment();
}

Executor& Module::executor() {
  AUTOSTAGE_CHECK(executor_ != nullptr, "the module is deployed on its first forward call");
  return *executor_;
}

}  // namespace autostage::staging
