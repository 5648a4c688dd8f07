#pragma once
// Runs a node subset of an IR graph captured by torch.export, operator by operator through the
// ATen dispatcher: no TorchScript. With grad mode on, each call records autograd as eager PyTorch
// does (the dispatcher's Autograd key), so gradients reach the tensors fed in.
//
// Note [Export node kinds]
// The torch.export front end (autostage/export.py) names an operator node by its overload,
// `ns::name.overload` (`aten::linear.default`, `aten::add.Tensor`), and passes every schema
// argument as a node input, in schema order (keyword-only and defaulted ones too), so a node
// maps onto one boxed dispatcher call. Besides operators it writes:
//   prim::Constant     a None/bool/int/float/str/Device/list constant (attribute `value`, read
//                      with the output type; absent for None);
//   prim::ListConstruct a list argument (`int[]`, `Tensor[]`, `Tensor?[]`) from its elements;
//   _operator::<op>    Python arithmetic on sizes (add, sub, mul, floordiv, truediv, mod, neg,
//                      pow, eq, ne, lt, le, gt, ge), e.g. `batch * heads` under a dynamic batch.
// An operator returning a list (`aten::split.Tensor`) has one IR output per element. A number
// given for a Tensor argument (`x * 2` is `aten::mul.Tensor(x, 2)`) becomes a wrapped-number
// tensor, as PyTorch's Python binding makes it, so type promotion matches eager exactly.
// TorchScript kinds never contain '.', so the kinds alone tell the two front ends' graphs apart.
//
// Note [View of a dropped contiguous]
// `x.permute(...).contiguous().view(...)` records no operator for `.contiguous()` when the
// permuted tensor happened to be contiguous at the captured sizes (nn.MultiheadAttention's output
// at some batch sizes), so at another micro-batch size the view may meet a non-contiguous tensor
// that eager PyTorch would have copied first. aten::view.default therefore runs as aten::reshape
// (the same copy, same values, same gradients) when, and only when, the view is impossible.

#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <vector>

#include "core/ir/graph.h"

namespace autostage::exportfe {

// True when `graph` was captured by torch.export (some operator kind has an overload suffix,
// Note [Export node kinds]).
bool isExportGraph(const core::Graph& graph);

// True for a kind of the form `ns::name.overload`.
bool isOverloadKind(const std::string& kind);

// A compiled node subset: slots instead of value ids, so one program serves every structurally
// identical subset (ExportedFunction::rebind). Immutable after construction; run() may be called
// concurrently (it keeps no state between runs).
class Program {
 public:
  // `nodes` sorted and convex; `inputs`/`outputs` the subset's boundary (core::Graph::boundary).
  // Throws UnsupportedError naming the node for an operator the dispatcher does not know, or a
  // node kind outside Note [Export node kinds].
  Program(const core::Graph& graph, const std::vector<core::NodeId>& nodes,
          const std::vector<core::ValueId>& inputs, const std::vector<core::ValueId>& outputs);
  ~Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  size_t inputCount() const;
  size_t outputCount() const;
  // Runs the nodes on `inputs` (one per boundary input); returns the boundary outputs.
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs the whole graph once on `inputs` (one per graph input, in order; pass copies: in-place
// operators such as BatchNorm's statistics update them) and sets every tensor value's type to
// the dtype, shape and requires_grad it had, like the TorchScript importer's probe run. Run it
// under the stages' autocast, so the IR records the dtypes the stages produce and routes carry
// (Note [Autocast execution]); export itself records the model's own dtypes.
void recordTypes(core::Graph& graph, std::vector<c10::IValue> inputs);

}  // namespace autostage::exportfe
