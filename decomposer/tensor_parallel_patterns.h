#pragma once
// The IR patterns Megatron-style tensor parallelism shards (Note [Tensor-parallel patterns]), and
// their costs added to the blocks (BlockCost::shardable; Note [Tensor-parallel cost] in
// cost_model.h). Pure functions of the graph and its profile.
//
// Note [Tensor-parallel patterns]
// A linear node is aten::linear, or aten::matmul / aten::mm / aten::addmm with an input of class
// PARAM (the weight, possibly through aten::t: the traced form of nn.Linear). Two patterns are
// recognised, each ending in its row-parallel linear, whose output is all-reduced:
//   Attention: three or more linear nodes reading one value (Q, K, V: column-parallel, split by
//     heads) whose outputs reach one linear node (the output projection, row-parallel) through
//     per-head operations only (view, reshape, permute, transpose, contiguous, matmul, bmm,
//     softmax, dropout, div, mul, add, masked_fill, where, scaled_dot_product_attention). Every
//     tensor consumer of a value in the pattern is in the pattern; a tensor read from outside is
//     allowed only as a mask (add, masked_fill, where).
//   MLP: a linear node (column-parallel) whose output reaches a second linear node (row-parallel)
//     through a chain of single-consumer element-wise nodes (add/mul/div of a PARAM or CONST
//     operand such as the bias, gelu, relu, silu, tanh, sigmoid, dropout).
// Consumers that produce no tensor (aten::size, aten::Int, prim::NumToTensor) are ignored. A
// linear node belongs to at most one pattern (attention first). What matches nothing is left
// replicated, never guessed: e.g. a fused QKV linear followed by split/chunk, an embedding or LM
// head (vocabulary splits are not costed yet).
// Each pattern becomes a ShardableSpan over the blocks holding its nodes (a stage shards it only
// when it holds them all): its costs (the main nodes' profiled times and activations) and its
// parameters (those read by no node outside the pattern, the row-parallel node's 1-D bias
// excepted), with one all-reduce pair of the row-parallel output's bytes.

#include <vector>

#include "core/ir/graph.h"
#include "core/profile.h"
#include "decomposer/plan.h"

namespace autostage::decomposer {

struct Blocking;  // decomposer/coarsen.h

struct ShardPattern {
  bool attention = false;
  std::vector<core::NodeId> nodes;  // ascending: every node of the pattern, linear nodes included
  core::NodeId rowLinear = core::kNoNode;
};

std::vector<ShardPattern> findShardPatterns(const core::Graph& graph);

// Sets b.request.shardable from `patterns` (findShardPatterns(graph)'s). `groupCost` are the
// atomic groups' costs (calibrated) in b.groups' order.
void addShardableSpans(const core::Graph& graph, const core::GraphProfile& profile,
                       const std::vector<ShardPattern>& patterns,
                       const std::vector<BlockCost>& groupCost, Blocking& b);

}  // namespace autostage::decomposer
