#include "staging/executor.h"

#include <atomic>

#include <algorithm>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "core/log.h"
#include "core/pipeline_schedule.h"
#include "core/plan_usage.h"
#include "frontend/torchscript/type_convert.h"
#include "staging/loss_scaler.h"

namespace autostage::staging {

void ExecutorOptions::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError, gradientBucketBytes >= 1,
                     "gradient_bucket_bytes must be >= 1, got ", gradientBucketBytes);
}

std::string ExecutorOptions::toString() const {
  std::ostringstream out;
  out << "device=" << device.str() << " gradient_bucket_bytes=" << gradientBucketBytes
      << " synchronize_params=" << (synchronizeParams ? "true" : "false")
      << " precision=" << core::precisionName(precision);
  return out.str();
}

Executor::Executor(const torchscript::ImportedModel& model, VerifiedDeployment deployment,
                   std::shared_ptr<comm::Backend> backend, ExecutorOptions options)
    : model_(model),
      deployment_(std::move(deployment).release()),
      backend_(std::move(backend)),
      options_(options),
      rank_(backend_->rank()),
      gradientSync_(gradientGroups(model.graph, deployment_), options.gradientBucketBytes),
      transport_(*backend_),
      memory_(options.memoryMeter, deployment_, {}) {
  options_.validate();
  if (!options_.traceDirectory.empty())
    trace_ = std::make_unique<EventTrace>(rank_, options_.traceDirectory, options_.traceSteps);
  AUTOSTAGE_INTERNAL_ASSERT(deployment_.worldSize == backend_->worldSize(),
                            "a deployment verified for another world size");
  const int positions = core::pipelinePositions(deployment_);
  for (const core::StageDeployment& stage : deployment_.stages) {
    auto it = std::find(stage.ranks.begin(), stage.ranks.end(), rank_);
    if (it == stage.ranks.end()) continue;
    LocalStage local;
    local.id = stage.id;
    local.replicaIndex = static_cast<int>(it - stage.ranks.begin()) / stage.tensorParallel;
    local.member = static_cast<int>(it - stage.ranks.begin()) % stage.tensorParallel;
    local_.push_back(std::move(local));
    position_ = stage.id % positions;
  }
  for (const core::Route& route : deployment_.routes)
    routeKinds_.push_back(routeKind(model_.graph, route.value));
  for (core::ValueId out : model_.graph.outputs()) {
    for (size_t r = 0; r < deployment_.routes.size(); ++r)
      if (deployment_.routes[r].value == out) outputRoutes_.push_back(static_cast<int>(r));
  }
  if (!local_.empty()) {
    std::set<core::ValueId> paramIds;  // a parameter two local stages read is held once
    for (const LocalStage& local : local_)
      for (core::ValueId p : stageParams(model_.graph, deployment_.stages[local.id]))
        paramIds.insert(p);
    params_ = ParamStorage(model_, std::vector<core::ValueId>(paramIds.begin(), paramIds.end()));
    for (LocalStage& local : local_) {
      std::vector<core::ValueId> gradientInputs;
      for (size_t r = 0; r < deployment_.routes.size(); ++r) {
        const auto& consumers = deployment_.routes[r].consumerStages;
        bool mine = std::find(consumers.begin(), consumers.end(), local.id) != consumers.end();
        if (mine && carriesGradient(r)) gradientInputs.push_back(deployment_.routes[r].value);
      }
      const core::StageDeployment& stage = deployment_.stages[local.id];
      std::optional<TensorParallelMember> member;
      if (stage.tensorParallel > 1) {
        const auto first = stage.ranks.begin() + local.replicaIndex * stage.tensorParallel;
        member = TensorParallelMember{
            backend_, comm::Group(std::vector<int>(first, first + stage.tensorParallel)),
            local.member};
      }
      local.runner = std::make_unique<StageRunner>(model_.graph, stage, params_, gradientInputs,
                                                   options_.precision, options_.device.type(),
                                                   member);
      for (const std::string& line : local.runner->replicatedPatterns())
        core::logger("Runtime")->warn("stage {} (tp={}): {}", stage.name, stage.tensorParallel, line);
      if (const int random = local.runner->seededRandomOperators())
        core::logger("Runtime")->info(
            "stage {} (tp={}): {} random operator(s) besides dropout draw from generators seeded "
            "alike on every member (Note [Tensor-parallel random operators])",
            stage.name, stage.tensorParallel, random);
    }
    memory_ = MemoryWatch(options_.memoryMeter, deployment_, localStages());
  }
  if (options_.synchronizeParams) ParamStorage::synchronize(model_, *backend_);
  shardParameters();
}

// Note [Tensor-parallel parameters]
// Each member of a tensor-parallel stage keeps its slices of the sharded parameters: the
// model's own tensors take the slice as their data (at::Tensor::set_data), so an optimizer over
// them steps the slice and the whole parameter is no longer held. The slices are cut after the
// parameters are synchronized, from the same values on every member.
// After a switch to another deployment joined the slices (Note [Sharing sliced parameters] in
// checkpoint.cpp), the tensors are whole again on every rank and are cut the same way.
void Executor::shardParameters() {
  sliceLayouts_ = staging::sliceLayouts(model_, deployment_);
  for (const LocalStage& local : local_) {
    const core::StageDeployment& stage = deployment_.stages[local.id];
    if (stage.tensorParallel <= 1) continue;
    // Sliced, or whole with each member's share of the gradient (Note [Tensor-parallel
    // gradients]): neither is divided by the degree.
    std::set<core::ValueId> summed(local.runner->partialParams().begin(),
                                   local.runner->partialParams().end());
    for (const ParamShard& shard : local.runner->shards()) {
      summed.insert(shard.param);
      heldSlices_.push_back({params_.name(shard.param), shard, stage.tensorParallel, local.member,
                             model_.graph.value(shard.param).type.shape(), at::Tensor()});
    }
    for (core::ValueId p : stageParams(model_.graph, stage))
      if (!summed.count(p)) replicatedInGroup_.emplace(p, stage.tensorParallel);
  }
  sliceHeldParameters();
}

void Executor::sliceHeldParameters() {
  if (slicesHeld_) return;
  at::NoGradGuard noGrad;
  for (HeldSlice& held : heldSlices_) {
    at::Tensor param = params_.tensor(held.shard.param);
    if (held.data.defined() && param.sizes() == held.data.sizes() &&
        param.sizes().vec() != held.whole) {
      // Note [Keeping slices across a switch] in checkpoint.cpp: the previous deployment held
      // this very slice. A training deployment copies it into its own storage, which the
      // optimizer's parameters (their data_ptr) and ZeRO-1's pieces refer to; an inference one
      // takes the slice's storage as it is (nothing copied, data_ptr unchanged).
      if (param.data_ptr() != held.data.data_ptr()) {
        if (inferenceOnly())
          held.data = param.detach();
        else
          held.data.copy_(param.detach());
      }
      replaceParamData(param, held.data);
      continue;
    }
    AUTOSTAGE_INTERNAL_ASSERT(param.sizes().vec() == held.whole, "parameter '", held.name,
                              "' is neither whole nor this rank's slice when its slice is cut");
    at::Tensor cut = shardTensor(param, held.shard, held.degree, held.index);
    if (held.data.defined()) {
      held.data.copy_(cut);
    } else {
      held.data = cut;
    }
    replaceParamData(param, held.data);  // a whole tensor's gradient does not fit the slice
  }
  slicesHeld_ = true;
}

Executor::~Executor() {
  try {
    if (trace_) trace_->endStep();
  } catch (const std::exception& e) {
    core::logger("Runtime")->warn("could not write the event trace: {}", e.what());
  }
}

bool Executor::carriesGradient(size_t route) const {
  const core::Route& r = deployment_.routes[route];
  const core::Type& type = model_.graph.value(r.value).type;
  return r.carriesGradient && r.producerStage != core::kFeederStage &&
         core::isFloatingPoint(type.dtype());
}

const BatchLayout& Executor::layout() const {
  AUTOSTAGE_CHECK(layout_.has_value(), "no step has run yet; call forward() first");
  return *layout_;
}

std::vector<int> Executor::localStages() const {
  std::vector<int> ids;
  for (const LocalStage& local : local_) ids.push_back(local.id);
  return ids;
}

SampleRange Executor::myRows(const LocalStage& stage, int micro) const {
  return layout_->replicaRows(micro, stage.replicaIndex,
                              deployment_.stages[stage.id].replicaCount());
}

at::Tensor Executor::allocateRows(core::ValueId value, int64_t rows) const {
  const core::Type type = model_.graph.value(value).type.withBatchSize(rows);
  return at::empty(type.shape(), at::TensorOptions()
                                     .dtype(torchscript::dtypeToTorch(type.dtype()))
                                     .device(options_.device));
}

int Executor::outputIndex(const LocalStage& stage, core::ValueId value) const {
  const auto& outs = stage.runner->outputs();
  auto it = std::find(outs.begin(), outs.end(), value);
  AUTOSTAGE_INTERNAL_ASSERT(it != outs.end(), "value ", value, " is not an output of stage ",
                            stage.id);
  return static_cast<int>(it - outs.begin());
}

// ---- steps -----------------------------------------------------------------------------------

std::vector<at::Tensor> Executor::onStageDevice(const std::vector<at::Tensor>& tensors) const {
  std::vector<at::Tensor> moved;
  for (const at::Tensor& t : tensors)
    moved.push_back(t.defined() && t.device() != options_.device ? t.to(options_.device) : t);
  return moved;
}

void Executor::beginStep(const std::vector<at::Tensor>& inputs, bool agreed) {
  int64_t local = agreed ? checkAgreedBatch(inputs) : agreeLocalBatch(inputs);
  if (!layout_ || layout_->localBatch() != local) {
    layout_.emplace(local, backend_->worldSize(), deployment_.microBatchCount);
    std::vector<bool> skip;
    for (RouteKind kind : routeKinds_) skip.push_back(kind == RouteKind::Loss);
    plan_.emplace(deployment_, *layout_, skip);
  }
  transport_.reset();
  if (trace_) trace_->beginStep();
  memory_.begin(params_);
  for (LocalStage& local : local_) {
    local.runner->clear();
    local.outputs.assign(layout_->microBatchCount(), {});
  }
  lossSums_.assign(deployment_.routes.size(), 0.0);
  lossGradients_.assign(deployment_.routes.size(), 0.0);
}

std::vector<at::Tensor> Executor::forward(const std::vector<at::Tensor>& inputs, bool agreed) {
  // Note [Plan usage] (core/plan_usage.h): forward() runs gpipe, and a plan made for inference
  // budgets no activations for a backward.
  AUTOSTAGE_CHECK_AS(PlanError, deployment_.schedule == "gpipe", "forward() runs every "
                     "micro-batch's forward before any backward (gpipe), but this deployment runs "
                     "schedule ", deployment_.schedule, "; use trainStep(), or plan for "
                     "forward/backward (schedule gpipe)");
  AUTOSTAGE_CHECK_AS(PlanError, !(inferenceOnly() && at::GradMode::is_enabled()),
                     "this deployment was planned for inference (a forward under no_grad): it "
                     "budgets no activations for a backward; call it under torch.no_grad(), or "
                     "plan for forward/backward");
  beginStep(inputs, agreed);
  sendFeederRows(onStageDevice(inputs));
  for (LocalStage& local : local_)  // gpipe runs one stage per rank (pipelineShapeProblem)
    for (int m = 0; m < layout_->microBatchCount(); ++m) forwardMicro(local, m);
  std::vector<at::Tensor> outputs = receiveCallerOutputs();
  transport_.waitAll();
  if (!at::GradMode::is_enabled()) {  // nothing to keep for a backward: the step ends here
    for (LocalStage& local : local_) local.outputs.clear();
    endStepMemory();
  }
  return outputs;
}

void Executor::backward(const std::vector<at::Tensor>& outputGrads) {
  AUTOSTAGE_CHECK(layout_.has_value(), "backward() called before forward()");
  AUTOSTAGE_CHECK(outputGrads.size() == outputRoutes_.size(), "backward() needs one gradient per "
                  "model output (", outputRoutes_.size(), "), got ", outputGrads.size());
  const std::vector<at::Tensor> grads = onStageDevice(outputGrads);
  sendCallerGradients(grads);
  averageLossGradients(grads);
  for (auto local = local_.rbegin(); local != local_.rend(); ++local)
    for (int m = layout_->microBatchCount() - 1; m >= 0; --m) backwardMicro(*local, m);
  finishBackward();
}

std::vector<at::Tensor> Executor::trainStep(const std::vector<at::Tensor>& inputs,
                                            double lossScale, bool agreed) {
  checkLossScale(lossScale, "trainStep");
  for (size_t i = 0; i < outputRoutes_.size(); ++i) {
    AUTOSTAGE_CHECK_AS(UnsupportedError, routeKinds_[outputRoutes_[i]] == RouteKind::Loss,
                       "trainStep needs a model whose forward returns its loss(es), but output ",
                       i, " is a batch tensor; use forward() and backward() for such models");
  }
  AUTOSTAGE_CHECK_AS(PlanError, !inferenceOnly(), "trainStep() needs a deployment planned for "
                     "training, but this one was planned for inference (usage=inference)");
  beginStep(inputs, agreed);
  for (int r : outputRoutes_) lossGradients_[r] += lossScale;
  sendFeederRows(onStageDevice(inputs));
  if (position_ >= 0) {  // Note [Pipeline schedules] (core/pipeline_schedule.h)
    for (const core::PipelineOp& op :
         core::pipelineOrder(deployment_.schedule, position_, core::pipelinePositions(deployment_),
                             deployment_.virtualStages, layout_->microBatchCount())) {
      LocalStage& local = local_.at(op.chunk);
      if (op.forward) {
        forwardMicro(local, op.microBatch);
      } else {
        backwardMicro(local, op.microBatch);
      }
    }
  }
  std::vector<at::Tensor> losses = reduceLosses();
  finishBackward();
  return losses;
}

bool Executor::inferenceOnly() const {
  return core::recordedUsage(deployment_) == core::usageName(core::PlanUsage::Inference);
}

void Executor::finishBackward() {
  {
    TraceScope scope(trace_.get(), "wait_sends", localStage(), -1);
    transport_.waitAll();
  }
  if (!delayGradAllreduce()) allreduceGrads();
  for (LocalStage& local : local_) local.outputs.clear();  // the backward consumed them
  endStepMemory();
  if (trace_) trace_->endStep();
}

void Executor::endStepMemory() {
  std::optional<StepMemory> memory = memory_.end(params_, *backend_);
  if (memory && trace_) trace_->addMemory(*memory);
}

namespace {
std::atomic<bool> delayGradAllreduceFlag{false};
}  // namespace

void setDelayGradAllreduce(bool delay) { delayGradAllreduceFlag = delay; }
bool delayGradAllreduce() { return delayGradAllreduceFlag; }

void Executor::allreduceGrads() {
  TraceScope scope(trace_.get(), "allreduce", localStage(), -1);
  for (const auto& [p, degree] : replicatedInGroup_) {  // Note [Tensor-parallel gradients]
    const at::Tensor& t = params_.tensor(p);
    if (t.grad().defined()) t.mutable_grad().div_(degree);
  }
  gradientSync_.run(*backend_, params_);
}

void Executor::gatherParams() {
  TraceScope scope(trace_.get(), "allgather", localStage(), -1);
  gradientSync_.gatherParams(*backend_, params_);
}

void Executor::gatherGrads() {
  TraceScope scope(trace_.get(), "allgather", localStage(), -1);
  gradientSync_.gatherGrads(*backend_, params_);
}

double Executor::clipGradNorm(double maxNorm) {
  AUTOSTAGE_CHECK_AS(ConfigError, maxNorm > 0, "clip_grad_norm: max_norm must be > 0, got ",
                     maxNorm);
  const double norm = gradientSync_.globalNorm(*backend_, params_);
  const double coef = std::min(1.0, maxNorm / (norm + 1e-6));
  at::NoGradGuard noGrad;
  for (const at::Tensor& p : params_.parameters())
    if (p.grad().defined()) p.mutable_grad().mul_(coef);
  return norm;
}

double Executor::unscaleGradients(double scale) {
  checkLossScale(scale, "unscaling gradients");
  {
    at::NoGradGuard noGrad;
    for (const at::Tensor& p : params_.parameters())
      if (p.grad().defined()) p.mutable_grad().mul_(1.0 / scale);
  }
  return gradientSync_.globalNorm(*backend_, params_);
}

}  // namespace autostage::staging
