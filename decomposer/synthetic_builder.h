#pragma once
// Internal helper of synthetic.cpp: builds a graph and its analytic profile node by node.
// Not part of the public API.

#include <string>
#include <vector>

#include "decomposer/synthetic.h"

namespace autostage::decomposer::detail {

class SyntheticBuilder {
 public:
  SyntheticBuilder(const std::string& name, const DeviceModel& device, core::DType dtype);

  // Graph inputs: all before the first node (core::Graph's rule).
  core::ValueId batchInput(const std::string& name, std::vector<int64_t> shape, core::DType dtype);
  core::ValueId param(const std::string& name, std::vector<int64_t> shape);

  // A batch-dependent operator with analytic costs: `flops` per sample; `saves` keeps its output
  // for backward; `working` counts its output as temporary memory as well.
  core::ValueId op(const std::string& kind, const std::vector<core::ValueId>& inputs,
                   std::vector<int64_t> shape, double flops, const std::string& scope,
                   bool saves = true, bool working = false);
  // An operator whose work a neighbouring fused kernel does (TransformerShape::fusedKernels):
  // in the graph as traced, with its memory, but no time of its own.
  core::ValueId fusedOp(const std::string& kind, const std::vector<core::ValueId>& inputs,
                        std::vector<int64_t> shape, const std::string& scope, bool saves = true);
  // A shape operator of output `shape` reading a constant int list: `argument` (a permute's
  // dimensions), or the shape itself (a view's sizes) when empty.
  core::ValueId shapeOp(const std::string& kind, core::ValueId input, std::vector<int64_t> shape,
                        const std::string& scope, std::vector<int64_t> argument = {});
  // A parameter-side operator (e.g. aten::t on a weight): no batch cost.
  core::ValueId paramOp(const std::string& kind, core::ValueId input, std::vector<int64_t> shape,
                        const std::string& scope);
  core::ValueId constant(const std::string& scope);  // an Int whose value the graph does not say
  // Constants with their values, as the front ends record them: an operator's dimension, flag or
  // probability, a None argument.
  core::ValueId intConstant(int64_t value, const std::string& scope);
  core::ValueId floatConstant(double value, const std::string& scope);
  core::ValueId noneConstant(const std::string& scope);
  core::ValueId scalarOp(const std::string& kind, const std::vector<core::ValueId>& inputs,
                         const std::string& scope);
  // linear = t(W) + matmul + add(bias), the traced form; with `fusedBias` the add is a fusedOp.
  core::ValueId linear(core::ValueId x, core::ValueId weight, core::ValueId bias,
                       std::vector<int64_t> outShape, double flops, const std::string& scope,
                       bool fusedBias = false);

  SyntheticModel finish(core::ValueId loss);
  core::DType dtype() const { return dtype_; }

 private:
  double bytesOf(const std::vector<int64_t>& shape) const;
  core::NodeId add(const std::string& kind, const std::vector<core::ValueId>& inputs,
                   const core::Type& type, const std::string& scope,
                   std::vector<core::Attribute> attributes = {});

  DeviceModel device_;
  core::DType dtype_;      // of activations
  core::DType paramType_;  // of parameters
  core::Graph graph_;
  std::vector<core::NodeProfile> profiles_;
};

}  // namespace autostage::decomposer::detail
