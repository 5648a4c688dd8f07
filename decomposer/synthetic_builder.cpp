// SyntheticBuilder: graph + analytic profile; see synthetic_builder.h.
#include "decomposer/synthetic_builder.h"

#include <algorithm>

#include "core/error.h"

namespace autostage::decomposer::detail {
namespace {

// Operators PyTorch answers with a view of their input: no copy, no kernel.
bool isView(const std::string& kind) {
  return kind == "aten::view" || kind == "aten::permute" || kind == "aten::transpose" ||
         kind == "aten::t";
}

}  // namespace

SyntheticBuilder::SyntheticBuilder(const std::string& name, const DeviceModel& device, core::DType dtype)
    : device_(device), dtype_(dtype), paramType_(device.parameterType.value_or(dtype)),
      graph_(name) {}

double SyntheticBuilder::bytesOf(const std::vector<int64_t>& shape) const {
  double elements = 1;
  for (int64_t d : shape) elements *= static_cast<double>(d);
  return elements * static_cast<double>(core::elementSize(dtype_));
}

core::ValueId SyntheticBuilder::batchInput(const std::string& name, std::vector<int64_t> shape,
                                           core::DType dtype) {
  return graph_.addInput(name, core::Type::tensor(dtype, std::move(shape)), core::ValueClass::Batch);
}

core::ValueId SyntheticBuilder::param(const std::string& name, std::vector<int64_t> shape) {
  return graph_.addInput(name, core::Type::tensor(paramType_, std::move(shape), true),
                         core::ValueClass::Param);
}

core::NodeId SyntheticBuilder::add(const std::string& kind,
                                   const std::vector<core::ValueId>& inputs, const core::Type& type,
                                   const std::string& scope,
                                   std::vector<core::Attribute> attributes) {
  core::NodeId id = graph_.addNode(kind, inputs, {type}, std::move(attributes), scope);
  core::NodeProfile p;
  p.node = id;
  profiles_.push_back(p);
  return id;
}

core::ValueId SyntheticBuilder::op(const std::string& kind, const std::vector<core::ValueId>& inputs,
                                   std::vector<int64_t> shape, double flops, const std::string& scope,
                                   bool saves, bool working) {
  const double out = bytesOf(shape);
  double in = 0;
  for (core::ValueId v : inputs) {
    const core::Type& t = graph_.value(v).type;
    if (t.isTensor() && t.bytes() > 0 && !t.requiresGrad()) in += static_cast<double>(t.bytes());
  }
  core::NodeId id = add(kind, inputs, core::Type::tensor(dtype_, std::move(shape)), scope);
  core::NodeProfile& p = profiles_[id];
  // Note [Device presets]: the roofline form overlaps a kernel's bytes with its FLOPs.
  const bool view = device_.roofline && isView(kind);
  const double flopSeconds = flops / (device_.peakFlops * device_.efficiency);
  const double byteSeconds = view ? 0 : (in + out) / device_.memoryBandwidth;
  const double seconds =
      device_.roofline ? std::max(flopSeconds, byteSeconds) : flopSeconds + byteSeconds;
  const double launch = view ? 0 : device_.launchSeconds;
  p.forwardSeconds = {launch, seconds};
  p.backwardSeconds = {2 * launch, 2 * seconds};
  p.outputBytes = {0, out};
  p.activationBytes = {0, saves ? out : 0};
  p.workingBytes = {0, working ? out : 0};
  return graph_.node(id).outputs[0];
}

core::ValueId SyntheticBuilder::fusedOp(const std::string& kind,
                                        const std::vector<core::ValueId>& inputs,
                                        std::vector<int64_t> shape, const std::string& scope,
                                        bool saves) {
  core::ValueId v = op(kind, inputs, std::move(shape), 0, scope, saves);
  core::NodeProfile& p = profiles_[graph_.value(v).producer];
  p.forwardSeconds = p.backwardSeconds = {0, 0};
  return v;
}

core::ValueId SyntheticBuilder::constant(const std::string& scope) {
  return graph_.node(add("prim::Constant", {}, core::Type::scalar(core::TypeKind::Int), scope)).outputs[0];
}

core::ValueId SyntheticBuilder::scalarOp(const std::string& kind, const std::vector<core::ValueId>& inputs,
                                         const std::string& scope) {
  core::NodeId id = add(kind, inputs, core::Type::scalar(core::TypeKind::Int), scope);
  profiles_[id].forwardSeconds = {1e-7, 0};
  profiles_[id].outputBytes = {8, 0};
  return graph_.node(id).outputs[0];
}

core::ValueId SyntheticBuilder::intConstant(int64_t value, const std::string& scope) {
  const core::Type type = core::Type::scalar(core::TypeKind::Int);
  return graph_.node(add("prim::Constant", {}, type, scope, {{"value", value}})).outputs[0];
}

core::ValueId SyntheticBuilder::floatConstant(double value, const std::string& scope) {
  const core::Type type = core::Type::scalar(core::TypeKind::Float);
  return graph_.node(add("prim::Constant", {}, type, scope, {{"value", value}})).outputs[0];
}

core::ValueId SyntheticBuilder::noneConstant(const std::string& scope) {
  const core::Type type = core::Type::scalar(core::TypeKind::None);
  return graph_.node(add("prim::Constant", {}, type, scope)).outputs[0];
}

core::ValueId SyntheticBuilder::shapeOp(const std::string& kind, core::ValueId input,
                                        std::vector<int64_t> shape, const std::string& scope,
                                        std::vector<int64_t> argument) {
  if (argument.empty()) argument = shape;
  const core::Type type = core::Type::list(core::Type::scalar(core::TypeKind::Int));
  const core::NodeId list =
      add("prim::Constant", {}, type, scope, {{"value", std::move(argument)}});
  const core::ValueId out = op(kind, {input, graph_.node(list).outputs[0]}, shape, 0, scope, false);
  const core::Type& in = graph_.value(input).type;
  if (in.dtype() != dtype_) {  // a view keeps its input's dtype (the labels' int64)
    graph_.setType(out, core::Type::tensor(in.dtype(), shape));
    const double bytes = static_cast<double>(graph_.value(out).type.bytes());
    profiles_[graph_.value(out).producer].outputBytes = {0, bytes};
  }
  return out;
}

core::ValueId SyntheticBuilder::paramOp(const std::string& kind, core::ValueId input,
                                        std::vector<int64_t> shape, const std::string& scope) {
  core::NodeId id = add(kind, {input}, core::Type::tensor(paramType_, std::move(shape), true), scope);
  return graph_.node(id).outputs[0];
}

core::ValueId SyntheticBuilder::linear(core::ValueId x, core::ValueId weight, core::ValueId bias,
                                       std::vector<int64_t> outShape, double flops,
                                       const std::string& scope, bool fusedBias) {
  const auto& w = graph_.value(weight).type.shape();
  core::ValueId wt = paramOp("aten::t", weight, {w.at(1), w.at(0)}, scope);
  core::ValueId y = op("aten::matmul", {x, wt}, outShape, flops, scope);
  if (fusedBias) return fusedOp("aten::add", {y, bias}, outShape, scope, false);
  return op("aten::add", {y, bias}, outShape, 0, scope, false);
}

SyntheticModel SyntheticBuilder::finish(core::ValueId loss) {
  graph_.addOutput(loss);
  graph_.classifyValues();
  AUTOSTAGE_INTERNAL_ASSERT(graph_.value(loss).cls == core::ValueClass::Loss,
                            "synthetic loss is not classified LOSS");
  SyntheticModel model{std::move(graph_), {}};
  model.profile.graphHash = model.graph.hash();
  model.profile.deviceKind = device_.kind;
  model.profile.dtype = core::dtypeName(dtype_);
  model.profile.estimated = true;
  model.profile.batchSizes = {1};
  model.profile.nodes = std::move(profiles_);
  return model;
}

}  // namespace autostage::decomposer::detail
