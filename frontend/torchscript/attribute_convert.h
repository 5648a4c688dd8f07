#pragma once
// Node attributes and constants between TorchScript and the IR.
//
// Ordinary attributes (i, f, s, is, fs, ss, t) map one to one onto core::AttributeValue.
// `prim::Constant` values are carried as the attribute `value` (absent for None) and rebuilt on
// export from that attribute plus the IR output type (bool/int, list element type, Device), so
// constants stored as IValue attributes (lists) or strings (devices) come back exactly.

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <vector>

#include "core/ir/node.h"

namespace autostage::torchscript {

// All attributes of `node`; throws UnsupportedError naming `where` for kinds the IR cannot carry
// (graphs, complex numbers, IValues other than lists of int/float/bool/str).
std::vector<core::Attribute> attributesFromTorch(const torch::jit::Node* node,
                                                 const std::string& where);

// Sets IR attributes on a freshly created TorchScript node (inverse of attributesFromTorch for
// non-constant nodes).
void attributesToTorch(const std::vector<core::Attribute>& attributes, torch::jit::Node* node);

// The constant an IR `prim::Constant` node denotes. Throws UnsupportedError naming `where` when
// the attribute does not fit the output type.
c10::IValue constantValue(const core::Node& node, const core::Type& outputType,
                          const std::string& where);

core::TensorData tensorDataFromTorch(const at::Tensor& tensor, const std::string& where);
at::Tensor tensorDataToTorch(const core::TensorData& data);

}  // namespace autostage::torchscript
