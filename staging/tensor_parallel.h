#pragma once
// A tensor-parallel stage: the stage's nodes rewritten for one member of a group of `degree`
// ranks (Megatron's layout), and the parameter slices each member holds. Torch-free; the
// collectives are the operators of staging/tensor_parallel_ops.h.
//
// Note [Tensor-parallel stages]
// Every attention and MLP pattern (Note [Tensor-parallel patterns] in
// decomposer/tensor_parallel_patterns.h) whose nodes the stage holds is sharded:
//  - its column-parallel linear nodes (Q/K/V, the MLP's first linear and a gated sibling) read
//    `autostage::tp_copy(x)` (identity forward, all-reduce of the gradient backward), one per
//    activation, and hold rows [j n/t, (j+1) n/t) of their weight's output dimension (and bias);
//    a fused projection later split in k parts holds that slice of each part;
//  - the split dimension is followed through the pattern's nodes (element-wise, views, permutes,
//    transposes, matmuls, softmax, sdpa, slices, cat, unsqueeze, expand, split); a view's or an
//    expand's size and a split's sizes at that dimension become 1/t when they are constants (-1
//    and sizes read from the sharded tensors stay as they are); an element-wise parameter of the
//    split extent (a separate bias) is sliced too;
//  - the row-parallel linear holds columns [j n/t, (j+1) n/t) of its weight's input dimension,
//    runs without its bias and its output goes through `autostage::tp_reduce(y, bias)`
//    (all-reduce sum forward then the bias, identity backward);
//  - K and V projections of fewer heads than the degree (grouped-query and multi-query
//    attention) run whole on every member, reading the same tp_copy as Q, and their values are
//    cut to the member's heads where they meet Q's (`autostage::tp_slice`; Note [Whole K/V
//    heads] in decomposer/tensor_parallel_split.h); their parameters' gradients are partial.
// Outside the patterns every node runs as it is, replicated over the group: the inputs of every
// member are the same, so are its outputs and the gradients it sends back. A pattern the
// propagation cannot follow (a head-specific mask from outside, a view that mixes the split
// dimension with another, a size computed from an unsharded tensor) stays replicated, never
// guessed, and is named by `skipped`. A vocabulary embedding whose table nothing else reads
// runs as `autostage::tp_embedding`: each member holds 1/t of the rows (Megatron's
// VocabParallelEmbedding), and so does one whose table only an LM head in another stage also
// reads (Note [Tied tables across stages] in gradient_sync.h). An LM head whose weight nothing
// else reads, or only a vocabulary embedding (a tied table: split once, by rows, for both where
// the stage holds both, else for the head alone), is
// column-parallel over the vocabulary (its input through tp_copy, rows [j V/t, (j+1) V/t) of its
// weight); the split logits are followed to the loss, whose log-softmax and loss become
// `autostage::tp_log_softmax`, `tp_nll_loss` or `tp_cross_entropy` (Note [Vocabulary-parallel
// loss] in staging/tensor_parallel_ops.h); a loss with class weights or probability targets, or
// a vocabulary that does not divide by t, leaves the head replicated. Every dropout becomes
// `autostage::tp_dropout`, which draws the group's masks (Note [Tensor-parallel dropout] in
// staging/tensor_parallel_ops.h).

#include <string>
#include <vector>

#include "core/ir/graph.h"
#include "decomposer/tensor_parallel_split.h"

namespace autostage::staging {

using decomposer::ParamShard;  // the slices a member holds of a parameter

struct ShardedStage {
  core::Graph graph;                   // the stage for one member (the same for every member)
  std::vector<core::ValueId> inputs;   // graph.inputs()[i] stands for original value inputs[i]
  std::vector<core::ValueId> outputs;  // graph.outputs()[i] stands for original value outputs[i]
  // Per node of `graph`: the node of the original graph it runs (rewritten or not), kNoNode for
  // what the rewrite adds (constants, lists, tp_copy, tp_reduce).
  std::vector<core::NodeId> origin;
  std::vector<ParamShard> shards;      // ascending param
  // Whole parameters whose gradient each member holds its heads' share of (PatternPlan::partial):
  // summed over the group, not divided by the degree (Note [Tensor-parallel gradients]).
  std::vector<core::ValueId> partial;  // ascending
  int sharded = 0;                     // patterns sharded
  std::vector<core::NodeId> patternNodes;  // the original nodes of the sharded patterns, ascending
  // Random operators other than the dropouts rewritten to tp_dropout (torch.randn_like,
  // bernoulli, ...): the runner seeds every member's generators alike around the stage's run
  // (Note [Tensor-parallel random operators] in staging/stage_runner.h).
  int ownRandom = 0;
  // One line per pattern left replicated, with the reason.
  std::vector<std::string> skipped;
};

// The stage of `graph` holding `nodes` (sorted, convex) for a group of `degree` ranks whose
// collectives use group handle `group` (tensorParallelGroup's). Its inputs and outputs are the
// stage's boundary (core::Graph::boundary), in order.
ShardedStage shardStage(const core::Graph& graph, const std::vector<core::NodeId>& nodes,
                        int degree, int64_t group);

// shardStage's `shards` alone: the parameter slices, without building the member's graph.
std::vector<ParamShard> shardedParameters(const core::Graph& graph,
                                          const std::vector<core::NodeId>& nodes, int degree);

}  // namespace autostage::staging
