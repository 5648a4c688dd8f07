// Executor: the data movement of a step (feeding, per-micro-batch stage execution, returning
// outputs and routing gradients). The step structure is in executor.cpp.
#include <algorithm>
#include <map>
#include <optional>
#include <sstream>

#include <ATen/ATen.h>

#include "core/error.h"
#include "frontend/torchscript/type_convert.h"
#include "staging/executor.h"

namespace autostage::staging {

std::string Executor::describeInputProblem(const std::vector<at::Tensor>& inputs) const {
  std::vector<core::ValueId> batchInputs = model_.graph.batchInputs();
  std::ostringstream out;
  if (batchInputs.empty()) return "the model has no batch input to split into micro-batches";
  if (inputs.size() != batchInputs.size()) {
    out << "the model takes " << batchInputs.size() << " tensor inputs, got " << inputs.size();
    return out.str();
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const core::Type& type = model_.graph.value(batchInputs[i]).type;
    const at::Tensor& t = inputs[i];
    if (!t.defined() || t.dim() < 1 || t.dim() != int64_t(type.shape().size())) {
      out << "input " << i << " must be a tensor of shape " << type.toString()
          << " with the batch in dim 0";
      return out.str();
    }
    bool sameRows = t.size(0) == inputs[0].size(0);
    bool sameRest = std::equal(type.shape().begin() + 1, type.shape().end(), t.sizes().begin() + 1);
    bool sameType = torchscript::dtypeToTorch(type.dtype()) == t.scalar_type();
    if (!sameRows || !sameRest || !sameType) {
      out << "input " << i << " has dtype " << t.scalar_type() << " and shape " << t.sizes()
          << " but the traced model expects " << type.toString()
          << " with the same batch size (dim 0) as input 0";
      return out.str();
    }
  }
  return "";
}

int64_t Executor::agreeLocalBatch(const std::vector<at::Tensor>& inputs) {
  std::string problem = describeInputProblem(inputs);
  int64_t local = problem.empty() ? inputs[0].size(0) : -1;
  std::vector<std::string> all{std::to_string(local) + "\n" + problem};
  if (backend_->worldSize() > 1) all = backend_->allGatherBytes(all[0], backend_->world());
  std::ostringstream problems, sizes;
  bool bad = false, differ = false;
  int64_t first = -2;
  for (size_t r = 0; r < all.size(); ++r) {
    size_t cut = all[r].find('\n');
    int64_t size = std::stoll(all[r].substr(0, cut));
    std::string text = all[r].substr(cut + 1);
    if (!text.empty()) problems << (bad ? "; " : "") << "rank " << r << ": " << text;
    bad = bad || !text.empty();
    differ = differ || (first != -2 && size != first);
    first = first == -2 ? size : first;
    sizes << (r ? ", " : "") << "rank " << r << ": " << size;
  }
  AUTOSTAGE_CHECK(!bad, "bad model inputs (", problems.str(),
                  "); pass the forward arguments as tensors with the batch in dim 0");
  AUTOSTAGE_CHECK(!differ, "ranks passed different local batch sizes (", sizes.str(),
                  "); every rank must pass the same number of samples");
  return local;
}

int64_t Executor::checkAgreedBatch(const std::vector<at::Tensor>& inputs) const {
  std::string problem = describeInputProblem(inputs);
  AUTOSTAGE_CHECK(problem.empty(), "bad model inputs (every rank: ", problem,
                  "); pass the forward arguments as tensors with the batch in dim 0");
  return inputs[0].size(0);
}

void Executor::sendFeederRows(const std::vector<at::Tensor>& inputs) {
  std::vector<core::ValueId> batchInputs = model_.graph.batchInputs();
  int64_t begin = layout_->rankRows(rank_).begin;
  for (int m = 0; m < layout_->microBatchCount(); ++m) {
    for (const Transfer* t : plan_->outgoing(rank_, core::kFeederStage, m)) {
      size_t index = std::find(batchInputs.begin(), batchInputs.end(), t->value) -
                     batchInputs.begin();
      AUTOSTAGE_INTERNAL_ASSERT(index < inputs.size(), "route of value ", t->value,
                                " starts at the feeder but the value is no model input");
      transport_.send(inputs[index].contiguous(), begin, *t, Direction::Forward);
    }
  }
}

void Executor::forwardMicro(LocalStage& stage, int micro) {
  SampleRange rows = myRows(stage, micro);
  std::unordered_map<core::ValueId, at::Tensor> inputs;
  for (core::ValueId v : stage.runner->routedInputs()) inputs[v] = allocateRows(v, rows.size());
  EventTrace* trace = trace_.get();
  {
    TraceScope scope(trace, "recv", stage.id, micro);
    for (const Transfer* t : plan_->incoming(rank_, stage.id, micro))
      transport_.receive(inputs.at(t->value), rows.begin, *t, Direction::Forward);
  }
  std::vector<at::Tensor>& outputs = stage.outputs[micro];
  {
    TraceScope scope(trace, "forward", stage.id, micro);
    outputs = stage.runner->forward(micro, inputs);
  }
  TraceScope scope(trace, "send", stage.id, micro);
  for (const Transfer* t : plan_->outgoing(rank_, stage.id, micro))
    transport_.send(outputs[outputIndex(stage, t->value)], rows.begin, *t, Direction::Forward);
  double weight = double(rows.size()) / double(layout_->globalBatch());
  for (size_t r = 0; r < deployment_.routes.size(); ++r) {
    const core::Route& route = deployment_.routes[r];
    if (routeKinds_[r] != RouteKind::Loss || route.producerStage != stage.id) continue;
    if (stage.member != 0) continue;  // a tensor-parallel group's loss counts once
    lossSums_[r] += weight * outputs[outputIndex(stage, route.value)].item<double>();
  }
}

void Executor::backwardMicro(LocalStage& stage, int micro) {
  SampleRange rows = myRows(stage, micro);
  std::vector<at::Tensor>& outputs = stage.outputs[micro];
  std::vector<at::Tensor> grads(outputs.size());
  EventTrace* trace = trace_.get();
  std::optional<TraceScope> receiving(std::in_place, trace, "recv_grad", stage.id, micro);
  for (const Transfer* t : plan_->outgoing(rank_, stage.id, micro)) {
    if (!carriesGradient(t->route) || !t->carriesGradient) continue;
    int index = outputIndex(stage, t->value);
    if (!grads[index].defined()) grads[index] = at::zeros_like(outputs[index]);
    at::Tensor part = allocateRows(t->value, t->rows.size());
    transport_.receive(part, t->rows.begin, *t, Direction::Gradient);
    grads[index].narrow(0, t->rows.begin - rows.begin, t->rows.size()).add_(part);
  }
  double weight = double(rows.size()) / double(layout_->globalBatch());
  for (size_t r = 0; r < deployment_.routes.size(); ++r) {
    const core::Route& route = deployment_.routes[r];
    if (routeKinds_[r] != RouteKind::Loss || route.producerStage != stage.id) continue;
    int index = outputIndex(stage, route.value);
    grads[index] = at::full_like(outputs[index], lossGradients_[r] * weight);
  }
  shareOutputGradients(stage, micro, grads);
  receiving.reset();
  std::unordered_map<core::ValueId, at::Tensor> inputGrads;
  {
    TraceScope scope(trace, "backward", stage.id, micro);
    inputGrads = stage.runner->backward(micro, grads);
  }
  TraceScope sending(trace, "send_grad", stage.id, micro);
  for (const Transfer* t : plan_->incoming(rank_, stage.id, micro)) {
    if (carriesGradient(t->route) && t->carriesGradient)
      transport_.send(inputGrads.at(t->value), rows.begin, *t, Direction::Gradient);
  }
  outputs.clear();
}

// The group's first member received the output gradients (Note [Tensor-parallel stages]); the
// others back-propagate the same ones. Which outputs get one follows from the plan, the same on
// every member.
void Executor::shareOutputGradients(const LocalStage& stage, int micro,
                                    std::vector<at::Tensor>& grads) {
  const core::StageDeployment& deployed = deployment_.stages[stage.id];
  if (deployed.tensorParallel <= 1) return;
  const auto first = deployed.ranks.begin() + stage.replicaIndex * deployed.tensorParallel;
  const comm::Group group(std::vector<int>(first, first + deployed.tensorParallel));
  std::vector<bool> received(grads.size(), false);
  for (const Transfer* t : plan_->outgoing(*first, stage.id, micro))
    if (carriesGradient(t->route) && t->carriesGradient)
      received[outputIndex(stage, t->value)] = true;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!received[i]) continue;
    if (!grads[i].defined()) grads[i] = at::zeros_like(stage.outputs[micro][i]);
    grads[i] = grads[i].contiguous();
    backend_->broadcast(grads[i], *first, group);
  }
}

std::vector<at::Tensor> Executor::receiveCallerOutputs() {
  std::map<int, at::Tensor> byRoute;
  int64_t begin = layout_->rankRows(rank_).begin;
  for (int r : outputRoutes_) {
    if (routeKinds_[r] != RouteKind::Rows || byRoute.count(r)) continue;
    at::Tensor buffer = allocateRows(deployment_.routes[r].value, layout_->localBatch());
    for (int m = 0; m < layout_->microBatchCount(); ++m)
      for (const Transfer* t : plan_->incoming(rank_, -1, m))
        if (t->route == r) transport_.receive(buffer, begin, *t, Direction::Forward);
    byRoute[r] = buffer;
  }
  std::vector<at::Tensor> losses = reduceLosses();
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < outputRoutes_.size(); ++i) {
    int r = outputRoutes_[i];
    outputs.push_back(routeKinds_[r] == RouteKind::Rows ? byRoute.at(r) : losses[i]);
  }
  return outputs;
}

std::vector<at::Tensor> Executor::reduceLosses() {
  std::vector<double> sums(deployment_.routes.size(), 0.0);
  bool any = false;
  for (size_t r = 0; r < sums.size(); ++r) {
    sums[r] = lossSums_[r];
    any = any || routeKinds_[r] == RouteKind::Loss;
  }
  // Made on the backend's device (CPU for MPI and thread ranks, the GPU for NCCL); the losses
  // returned are on the stages' device, like every other output.
  at::Tensor total = at::tensor(sums, at::dtype(at::kDouble).device(backend_->tensorDevice()));
  if (any && backend_->worldSize() > 1)
    backend_->allReduce(total, comm::ReduceOp::Sum, backend_->world());
  total = total.cpu();
  std::vector<at::Tensor> losses;
  for (int r : outputRoutes_) {
    const core::Type& type = model_.graph.value(deployment_.routes[r].value).type;
    at::Tensor loss = at::scalar_tensor(total[r].item<double>(), at::kDouble);
    losses.push_back(routeKinds_[r] == RouteKind::Loss
                         ? loss.to(options_.device, torchscript::dtypeToTorch(type.dtype()))
                               .reshape(type.shape())
                         : at::Tensor());
  }
  return losses;
}

void Executor::sendCallerGradients(const std::vector<at::Tensor>& outputGrads) {
  std::map<int, at::Tensor> byRoute;  // a value returned twice gets the sum of its gradients
  for (size_t i = 0; i < outputRoutes_.size(); ++i) {
    int r = outputRoutes_[i];
    if (routeKinds_[r] != RouteKind::Rows || !carriesGradient(r)) continue;
    at::Tensor g = outputGrads[i].defined()
                       ? outputGrads[i].detach() / double(backend_->worldSize())
                       : allocateRows(deployment_.routes[r].value, layout_->localBatch()).zero_();
    byRoute[r] = byRoute.count(r) ? byRoute[r] + g : g;  // Note [Gradient scaling]
  }
  int64_t begin = layout_->rankRows(rank_).begin;
  for (const auto& [r, g] : byRoute) {
    at::Tensor grad = g.contiguous();
    for (int m = 0; m < layout_->microBatchCount(); ++m)
      for (const Transfer* t : plan_->incoming(rank_, -1, m))
        if (t->route == r) transport_.send(grad, begin, *t, Direction::Gradient);
  }
}

void Executor::averageLossGradients(const std::vector<at::Tensor>& outputGrads) {
  bool any = false;
  std::vector<double> grads(deployment_.routes.size(), 0.0);
  for (size_t i = 0; i < outputRoutes_.size(); ++i) {
    int r = outputRoutes_[i];
    if (routeKinds_[r] != RouteKind::Loss) continue;
    any = true;
    if (outputGrads[i].defined()) grads[r] += outputGrads[i].item<double>();
  }
  if (!any) return;
  at::Tensor total = at::tensor(grads, at::dtype(at::kDouble).device(backend_->tensorDevice()));
  if (backend_->worldSize() > 1)
    backend_->allReduce(total, comm::ReduceOp::Average, backend_->world());
  total = total.cpu();
  for (size_t r = 0; r < grads.size(); ++r) lossGradients_[r] = total[r].item<double>();
}

}  // namespace autostage::staging
