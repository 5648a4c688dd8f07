#include "staging/stage_runner.h"

#include <algorithm>
#include <set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "frontend/torchscript/autocast.h"

namespace autostage::staging {
namespace {

bool isGraphParam(const core::Graph& graph, core::ValueId v) {
  const core::Value& value = graph.value(v);
  return value.producer == core::kNoNode && value.cls == core::ValueClass::Param;
}

bool isLocalDerived(const core::Graph& graph, core::ValueId v) {
  const core::Value& value = graph.value(v);
  return value.producer != core::kNoNode &&
         (value.cls == core::ValueClass::Param || value.cls == core::ValueClass::Const);
}

// Values the stage reads that are derived from parameters/constants by other stages' nodes.
std::vector<core::ValueId> derivedInputs(const core::Graph& graph, const core::Boundary& b) {
  std::vector<core::ValueId> out;
  for (core::ValueId v : b.inputs)
    if (isLocalDerived(graph, v)) out.push_back(v);
  return out;
}

// All nodes `values` depend on (their producers and, transitively, the producers' inputs).
std::vector<core::NodeId> ancestorNodes(const core::Graph& graph,
                                        const std::vector<core::ValueId>& values) {
  std::set<core::NodeId> seen;
  std::vector<core::ValueId> todo = values;
  while (!todo.empty()) {
    core::NodeId n = graph.producer(todo.back());
    todo.pop_back();
    if (n == core::kNoNode || !seen.insert(n).second) continue;
    for (core::ValueId in : graph.node(n).inputs) todo.push_back(in);
  }
  return {seen.begin(), seen.end()};
}

void addParams(const core::Graph& graph, const std::vector<core::ValueId>& inputs,
               std::set<core::ValueId>* params) {
  for (core::ValueId v : inputs)
    if (isGraphParam(graph, v)) params->insert(v);
}

at::Tensor outputTensor(const c10::IValue& value) {
  return value.isTensor() ? value.toTensor() : at::Tensor();
}

}  // namespace

std::vector<core::ValueId> stageParams(const core::Graph& graph,
                                       const core::StageDeployment& stage) {
  core::Boundary boundary = graph.boundary(stage.nodes);
  std::set<core::ValueId> params;
  addParams(graph, boundary.inputs, &params);
  std::vector<core::ValueId> derived = derivedInputs(graph, boundary);
  if (!derived.empty())
    addParams(graph, graph.boundary(ancestorNodes(graph, derived)).inputs, &params);
  return {params.begin(), params.end()};
}

// The stage's function: its nodes as they are, or for a tensor-parallel member the sharded
// stage (Note [Tensor-parallel stages]) reading and producing the original values.
torchscript::ExportedFunction StageRunner::makeFunction(const core::Graph& graph,
                                                        const std::optional<TensorParallelMember>& tp) {
  if (!tp || stage_.tensorParallel <= 1) return torchscript::exportSubgraph(graph, stage_.nodes);
  group_ = std::make_unique<TensorParallelGroup>(tp->backend, tp->group, tp->index);
  ShardedStage sharded = shardStage(graph, stage_.nodes, stage_.tensorParallel, group_->handle());
  shards_ = sharded.shards;
  partial_ = sharded.partial;
  replicated_ = sharded.skipped;
  ownRandom_ = sharded.ownRandom;
  std::vector<core::NodeId> all;
  for (const core::Node& n : sharded.graph.nodes()) all.push_back(n.id);
  torchscript::ExportedFunction function = torchscript::exportSubgraph(sharded.graph, all);
  std::unordered_map<core::ValueId, core::ValueId> original;
  for (size_t i = 0; i < sharded.inputs.size(); ++i)
    original[sharded.graph.inputs()[i]] = sharded.inputs[i];
  for (size_t i = 0; i < sharded.outputs.size(); ++i)
    original[sharded.graph.outputs()[i]] = sharded.outputs[i];
  auto map = [&](const std::vector<core::ValueId>& ids) {
    std::vector<core::ValueId> out;
    for (core::ValueId v : ids) out.push_back(original.at(v));
    return out;
  };
  return function.rebind(map(function.inputs()), map(function.outputs()));
}

StageRunner::StageRunner(const core::Graph& graph, const core::StageDeployment& stage,
                         const ParamStorage& params, std::vector<core::ValueId> gradientInputs,
                         core::Precision precision, c10::DeviceType device,
                         std::optional<TensorParallelMember> tensorParallel)
    : stage_(stage),
      params_(params),
      function_(makeFunction(graph, tensorParallel)),
      gradientInputs_(std::move(gradientInputs)),
      precision_(precision),
      device_(device) {
  core::Boundary boundary = graph.boundary(stage.nodes);
  for (core::ValueId v : boundary.inputs)
    if (!isGraphParam(graph, v) && !isLocalDerived(graph, v)) routedInputs_.push_back(v);
  std::vector<core::ValueId> derived = derivedInputs(graph, boundary);
  if (!derived.empty()) {
    prelude_ = std::make_unique<torchscript::ExportedFunction>(
        torchscript::exportSubgraph(graph, ancestorNodes(graph, derived)));
  }
}

namespace {

// Note [Tensor-parallel random operators]: the default generators of `devices` seeded with
// `seed` while it lives, then put back as they were.
class SeededGenerators {
 public:
  SeededGenerators(const std::vector<c10::Device>& devices, uint64_t seed)
      : own_(saveRngStates(devices)) {
    seedRngStates(devices, seed);
  }
  ~SeededGenerators() { swapRngStates(own_); }
  SeededGenerators(const SeededGenerators&) = delete;
  SeededGenerators& operator=(const SeededGenerators&) = delete;

 private:
  RngStates own_;
};

}  // namespace

// Note [Stage inputs are copied]
// The stage's graph may update an input in place (ResNet's `relu_` or `add_` right after a stage
// boundary). On a leaf that requires grad autograd refuses that, and a recompute stage must find
// its saved inputs unchanged when it re-runs, so those inputs are fed as copies (a clone is
// differentiable: the gradient still reaches the leaf).
std::vector<at::Tensor> StageRunner::run(
    const std::unordered_map<core::ValueId, at::Tensor>& inputs) {
  std::optional<SeededGenerators> seeded;
  if (group_ && ownRandom_ > 0)
    seeded.emplace(rngDevices(tensorDevices(inputs)), group_->nextSeed());
  torchscript::AutocastGuard autocast(precision_, device_);  // Note [Autocast execution]
  std::unordered_map<core::ValueId, c10::IValue> derived;
  if (prelude_) {
    std::vector<c10::IValue> args;
    for (core::ValueId v : prelude_->inputs()) args.emplace_back(params_.tensor(v));
    std::vector<c10::IValue> results = prelude_->run(std::move(args));
    for (size_t i = 0; i < results.size(); ++i) derived[prelude_->outputs()[i]] = results[i];
  }
  std::vector<c10::IValue> args;
  for (core::ValueId v : function_.inputs()) {
    auto routed = inputs.find(v);
    if (routed != inputs.end()) {  // Note [Stage inputs are copied]
      const at::Tensor& t = routed->second;
      args.emplace_back(stage_.recompute || t.requires_grad() ? t.clone() : t);
    } else if (params_.has(v)) {
      args.emplace_back(params_.tensor(v));
    } else {
      AUTOSTAGE_INTERNAL_ASSERT(derived.count(v), "stage ", stage_.name,
                                " has no source for its input value ", v);
      args.push_back(derived.at(v));
    }
  }
  std::vector<c10::IValue> results = function_.run(std::move(args));
  std::vector<at::Tensor> out;
  for (const c10::IValue& r : results) out.push_back(outputTensor(r));
  return out;
}

std::unordered_map<core::ValueId, at::Tensor> StageRunner::makeLeaves(
    const std::unordered_map<core::ValueId, at::Tensor>& inputs) const {
  std::unordered_map<core::ValueId, at::Tensor> leaves;
  for (const auto& [v, t] : inputs) {
    at::Tensor leaf = t.detach();
    bool wantsGrad = std::find(gradientInputs_.begin(), gradientInputs_.end(), v) !=
                     gradientInputs_.end();
    if (wantsGrad && at::isFloatingType(leaf.scalar_type())) leaf.requires_grad_(true);
    leaves[v] = leaf;
  }
  return leaves;
}

std::vector<c10::Device> StageRunner::tensorDevices(
    const std::unordered_map<core::ValueId, at::Tensor>& inputs) const {
  std::vector<c10::Device> devices;
  for (const auto& [v, t] : inputs) devices.push_back(t.device());
  auto addParams = [&](const torchscript::ExportedFunction& fn) {
    for (core::ValueId v : fn.inputs())
      if (params_.has(v)) devices.push_back(params_.tensor(v).device());
  };
  addParams(function_);
  if (prelude_) addParams(*prelude_);
  return devices;
}

std::vector<at::Tensor> StageRunner::forward(
    int micro, const std::unordered_map<core::ValueId, at::Tensor>& inputs) {
  Saved saved;
  saved.inputs = makeLeaves(inputs);
  std::vector<at::Tensor> outputs;
  if (stage_.recompute) {
    saved.rngStates = saveRngStates(rngDevices(tensorDevices(saved.inputs)));
    if (group_) saved.groupDraws = group_->draws();  // Note [Tensor-parallel dropout]
    at::NoGradGuard noGrad;
    outputs = run(saved.inputs);
  } else {
    outputs = run(saved.inputs);  // records autograd unless the caller disabled grad mode
    saved.outputs = outputs;
  }
  // Under the caller's torch.no_grad() (inference) there is nothing to back-propagate: keep
  // nothing, so no activations outlive the call.
  if (at::GradMode::is_enabled()) saved_[micro] = std::move(saved);
  std::vector<at::Tensor> detached;
  for (const at::Tensor& t : outputs) detached.push_back(t.defined() ? t.detach() : t);
  return detached;
}

std::unordered_map<core::ValueId, at::Tensor> StageRunner::backward(
    int micro, const std::vector<at::Tensor>& outputGrads) {
  auto it = saved_.find(micro);
  AUTOSTAGE_INTERNAL_ASSERT(it != saved_.end(), "stage ", stage_.name, " has no forward state for micro-batch ", micro);
  Saved saved = std::move(it->second);
  saved_.erase(it);
  // Note [Recompute]: the buffers as the forward left them, restored once the re-run's autograd
  // graph (which checks their version counters) has been consumed.
  std::vector<at::Tensor> buffers, kept;
  if (stage_.recompute) {
    buffers = params_.buffers();
    for (const at::Tensor& b : buffers) kept.push_back(b.clone());
    RngStates current = swapRngStates(*saved.rngStates);  // Note [Recompute RNG state]
    const uint64_t draws = group_ ? group_->draws() : 0;
    if (group_) group_->setDraws(saved.groupDraws);  // Note [Tensor-parallel dropout]
    {
      at::AutoGradMode grad(true);
      saved.outputs = run(saved.inputs);
    }
    if (group_) group_->setDraws(draws);
    swapRngStates(current);
  }
  AUTOSTAGE_INTERNAL_ASSERT(outputGrads.size() == saved.outputs.size(), "stage ", stage_.name,
                            " got ", outputGrads.size(), " output gradients for ",
                            saved.outputs.size(), " outputs");
  std::vector<at::Tensor> roots, grads;
  for (size_t i = 0; i < saved.outputs.size(); ++i) {
    const at::Tensor& out = saved.outputs[i];
    if (!out.defined() || !out.requires_grad() || !outputGrads[i].defined()) continue;
    roots.push_back(out);
    grads.push_back(outputGrads[i]);
  }
  if (!roots.empty()) {
    at::AutoGradMode grad(true);
    torch::autograd::backward(roots, grads);
  }
  saved.outputs.clear();
  {
    at::NoGradGuard noGrad;
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(kept[i]);
  }
  std::unordered_map<core::ValueId, at::Tensor> inputGrads;
  for (core::ValueId v : gradientInputs_) {
    const at::Tensor& leaf = saved.inputs.at(v);
    inputGrads[v] = leaf.grad().defined() ? leaf.grad() : at::zeros_like(leaf);
  }
  return inputGrads;
}

}  // namespace autostage::staging
