#pragma once
// TorchScript module -> IR graph.
//
// importModule inlines `forward`, lifts parameters and buffers to trailing graph inputs
// (torch::jit::LowerGraph), runs the lowered graph once on copies of the example inputs and
// parameters to record the dtype and shape of every value, and converts each top-level node
// (kind, attributes, module scope; control-flow nodes keep their body as TorchScript text, see
// Note [Node body text]). Model inputs become BATCH inputs named after forward's arguments;
// parameters and buffers become PARAM inputs named by their state_dict key. The module and its
// tensors are not modified.
//
// Throws UnsupportedError naming the construct for: keyword-only arguments of forward, inputs that
// are not tensors or tuples/lists of tensors, outputs that are dicts or other non-tensor
// structures, complex/quantized dtypes, nodes whose attributes the IR cannot carry.

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include <string>
#include <vector>

#include "core/ir/graph.h"

namespace autostage::torchscript {

struct ImportedModel {
  core::Graph graph;
  // One entry per graph.paramInputs(), in order: the module's own parameter/buffer tensors
  // (shared storage, not copies) and their state_dict keys. Tied parameters appear once.
  std::vector<at::Tensor> paramTensors;
  std::vector<std::string> paramNames;
  // True when forward returned a tuple that was flattened into the graph outputs.
  bool tupleOutput = false;
  // The front end that captured the model: "TorchScript" (importModule) or "torch.export"
  // (autostage/export.py through the binding's builder; frontend/export/interpreter.h).
  std::string frontEnd = "TorchScript";
  // Rows of the batch dimension torch.export fixed in the graph (the captured batch size), 0
  // when it stayed dynamic (or for TorchScript). The model then profiles and plans micro-batches
  // of exactly that many rows (Note [Fixed micro-batch size] in decomposer/plan.h).
  int64_t fixedBatchRows = 0;
};

ImportedModel importModule(const torch::jit::Module& module,
                           const std::vector<c10::IValue>& exampleInputs);

// Scope of a TorchScript node as a module path (`layers.3.attn`), empty at top level: from the
// tracer's scope (`__module.layers/__module.layers.3`) or the inlined call stack.
std::string moduleScope(const torch::jit::Node* node);

}  // namespace autostage::torchscript
