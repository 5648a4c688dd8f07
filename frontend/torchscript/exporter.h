#pragma once
// IR node subset -> executable TorchScript function.
//
// exportSubgraph rebuilds a convex subset of an imported graph as a torch::jit::Graph whose
// inputs are the subset's boundary inputs and whose outputs are its boundary outputs
// (core::Graph::boundary, same order), and wraps it in a GraphFunction run by the simple
// executor (no profiling or autodiff-subgraph passes, so results match eager execution
// bit for bit). Autograd records through run(): gradients reach the tensors fed in.
// A graph captured by torch.export (exportfe::isExportGraph) runs instead through the ATen
// dispatcher interpreter (frontend/export/interpreter.h), without TorchScript; callers see no
// difference.

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/function_impl.h>

#include <memory>
#include <vector>

#include "core/ir/graph.h"
#include "frontend/export/interpreter.h"

namespace autostage::torchscript {

class ExportedFunction {
 public:
  ExportedFunction(std::shared_ptr<torch::jit::Graph> graph, std::vector<core::ValueId> inputs,
                   std::vector<core::ValueId> outputs);
  ExportedFunction(std::shared_ptr<const exportfe::Program> program,
                   std::vector<core::ValueId> inputs, std::vector<core::ValueId> outputs);

  // IR values fed to / returned by run(), in order.
  const std::vector<core::ValueId>& inputs() const { return inputs_; }
  const std::vector<core::ValueId>& outputs() const { return outputs_; }
  // The TorchScript graph; GraphFunction needs exactly one output, so 0 or 2+ outputs are
  // returned packed in one tuple (run() unpacks them). Null for a torch.export graph.
  const std::shared_ptr<torch::jit::Graph>& graph() const { return graph_; }
  // "torchscript" or "dispatcher" (torch.export graphs): how run() executes.
  const char* executor() const { return program_ ? "dispatcher" : "torchscript"; }

  // The same compiled function (graph and executor shared, nothing re-optimized) reading and
  // producing other IR values: for a structurally identical subset elsewhere in the graph.
  // Throws InternalError when the counts differ from this function's.
  ExportedFunction rebind(std::vector<core::ValueId> inputs,
                          std::vector<core::ValueId> outputs) const;
  // Runs the function; throws Error when the input count is wrong.
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) const;

 private:
  std::shared_ptr<torch::jit::Graph> graph_;
  bool packed_;  // graph returns the outputs as one tuple (GraphFunction needs exactly 1 output)
  std::shared_ptr<torch::jit::GraphFunction> function_;
  std::shared_ptr<const exportfe::Program> program_;  // set instead of graph_ and function_
  std::vector<core::ValueId> inputs_;
  std::vector<core::ValueId> outputs_;
};

// Throws PlanError when `nodes` is empty, has unknown or repeated ids, or is not convex.
ExportedFunction exportSubgraph(const core::Graph& graph, std::vector<core::NodeId> nodes);

}  // namespace autostage::torchscript
