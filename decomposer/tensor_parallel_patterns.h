#pragma once
// The IR patterns Megatron-style tensor parallelism shards (Note [Tensor-parallel patterns]), and
// their costs added to the blocks (BlockCost::shardable; Note [Tensor-parallel cost] in
// cost_model.h). Pure functions of the graph and its profile.
//
// Note [Tensor-parallel patterns]
// A linear node is aten::linear, or aten::matmul / aten::mm / aten::addmm with an input of class
// PARAM (the weight, possibly through a transpose: aten::t, the traced form of nn.Linear, or
// aten::numpy_T, `x @ w.T` as Falcon writes it). Operator names are compared without their
// overload (torch.export's aten::linear.default is aten::linear). Two patterns are recognised,
// each ending in its row-parallel linear, whose output is all-reduced:
//   Attention: three or more linear nodes reading one value (Q, K, V: column-parallel, split by
//     heads) whose outputs reach one linear node (the output projection, row-parallel) through
//     per-head operations only (views, reshapes, permutes, transposes, matmul, bmm, softmax,
//     dropout, element-wise arithmetic, masked_fill, where, scaled_dot_product_attention, alias,
//     and what rotary embeddings and grouped K/V heads add: slice, neg, cat with its list,
//     unsqueeze, expand, dtype casts, GPT-J's rotation of every two features: stack, flatten,
//     an RMSNorm of each head's features, Qwen3's: pow, mean, rsqrt, and element-wise functions:
//     Gemma-2's soft cap of the scores, tanh). Where an MLP's first linear reads that value too
//     (GPT-J's, Phi's and Falcon's attention and MLP side by side), Q, K and V are those reaching
//     one output projection. Cross-attention (an encoder-decoder's, BART's: Q from the decoder's
//     state, K and V from the encoder's output, which every decoder layer reads) is three or more
//     linear nodes left over reading two values whose outputs reach one output projection so. Every
//     tensor consumer of a value in the pattern is in the pattern, none is a graph output; a tensor
//     read from outside is allowed only as a mask or a position factor (add, mul, masked_fill,
//     where, the attention's mask argument). A fused projection counts as Q, K and V: one linear
//     node whose output is split three ways (aten::split, split_with_sizes or chunk, unpacked by
//     prim::ListUnpack on TorchScript; or read by three or more slices), through views, transposes,
//     unsqueezes and the add of its bias: GPT-2's and GPT-BigCode's c_attn (Q, K and V side by side
//     in the features, the latter's K and V one head each), Phi-3's qkv_proj (sliced) and
//     GPT-NeoX's and Megatron's (viewed into heads first, each head's Q, K and V side by side;
//     Falcon-40B's viewed into K/V groups, each its Q heads, K and V, taken apart by a slice and
//     aten::index, K and V broadcast to the group's Q heads: split by groups). Parts of unequal
//     sizes are the split's plan's (Note [Fused parts] in tensor_parallel_split.h). Whether a
//     layout splits is the split's plan's to say (tensor_parallel_split.h): it follows which
//     indices each member holds through every view, so a layout mixing the parts with the heads is
//     found and stays replicated.
//   MLP: a linear node (column-parallel) whose output reaches one second linear node
//     (row-parallel) through element-wise nodes (activations such as GPT-2's tanh GELU written
//     out, bias adds, dtype casts, dropout), views keeping the last dimension (GPT-2's Conv1D
//     flattens rows around its addmm) and splits along it (Phi-3's gate_up_proj, chunked into
//     the gate and up halves: a fused gated MLP); every tensor consumer inside, a BATCH tensor from
//     outside only the output of a sibling linear of the same input (a gated MLP: silu(gate(x)) *
//     up(x) -> down, as in Llama, Qwen2 and Mistral), which is column-parallel too.
// Consumers that produce no tensor (aten::size, aten::Int, prim::NumToTensor) are ignored. A
// linear node belongs to at most one pattern (attention first).
// Two more are split over the vocabulary (a PARAM of at least kVocabularyRows rows, as in
// Megatron's VocabParallelEmbedding and its column-parallel LM head with a parallel cross
// entropy):
//   Vocabulary embedding: an aten::embedding of such a weight; its output is all-reduced forward.
//   LM head: a linear node with such a weight whose output's last dimension is the vocabulary,
//     reaching a loss (aten::cross_entropy, aten::cross_entropy_loss, aten::nll_loss, _nd, 2d)
//     through single-consumer view, reshape, contiguous, slice, transpose, permute (the loss's
//     classes in dimension 1: [batch, vocabulary, positions]), dtype casts, the vocabulary
//     bias's add and log_softmax nodes, none of them a graph output; the logits stay split, the
//     loss all-reduces a few values per row forward, and the head's input gradient is
//     all-reduced backward.
// An LM head whose table a vocabulary embedding also reads (tied, as GPT-2's and Megatron's)
// takes that embedding into its pattern (ShardPattern::tiedEmbedding): a stage holding both ends
// splits the table once, by rows, for both; a stage holding one end (a pipeline's first or
// last) splits it for that end alone, at its own degree, and the runtime sums the table's
// gradient over both ends row by row (Note [Tied tables across stages] in
// staging/gradient_sync.h), as Megatron does for the copies on its first and last stages.
// Position embeddings (fewer rows) stay replicated.
// What matches nothing is left replicated, never guessed: e.g. an LM head whose logits are returned
// rather than fed to a loss (transformers' models return them). autostage.shard_patterns(ir) lists
// what is found.
// Each pattern becomes a ShardableSpan over the blocks holding its nodes (a stage shards it only
// when it holds them all, at the degrees the runtime's check splits it at: splitDegrees in
// tensor_parallel_split.h): its costs (the main nodes' profiled times and activations, but for what
// a column-parallel linear keeps: its input, whole on every member, and for the nodes run whole,
// SplitDegrees::wholeNodes: their time undivided at such a degree where not measured on a
// member, their activations whole at every degree) and its parameters (those read
// by no node outside the pattern, the row-parallel node's 1-D bias and the whole parameters the
// split reads across its dimension, PatternPlan::partial, excepted, and a fused projection's
// rows held whole at some degree, SplitDegrees::wholeShare, counted whole), with one all-reduce
// pair of the row-parallel output's bytes; a vocabulary pattern's one all-reduce (of the
// embedding's output, or of the head's input) is counted as a pair of half its bytes each way. A
// tied pattern gives a span per end, each splitting the table, and a correction over both
// (ShardableSpan::correction) taking the table back once, so a stage holding both ends counts
// it split once.

#include <string>
#include <vector>

#include "core/ir/graph.h"
#include "core/profile.h"
#include "decomposer/plan.h"

namespace autostage::decomposer {

struct Blocking;  // decomposer/coarsen.h

// Rows from which an embedding or LM head weight counts as a vocabulary (Note [Tensor-parallel
// patterns]): above the position tables of common models (512 to 8,192), below every tokenizer's
// vocabulary (30,522 for BERT, 32,000 for Llama 2, 50,257 for GPT-2).
constexpr int64_t kVocabularyRows = 16384;

struct ShardPattern {
  bool attention = false;
  std::vector<core::NodeId> nodes;  // ascending: every node of the pattern, linear nodes included
  core::NodeId rowLinear = core::kNoNode;  // attention and MLP: the row-parallel linear
  // Vocabulary patterns: the value all-reduced (the embedding's output, the head's input).
  enum class Vocabulary { None, Embedding, Head } vocabulary = Vocabulary::None;
  core::ValueId allreduced = -1;
  core::NodeId head = core::kNoNode;  // an LM head's linear node
  // An LM head whose table is also a vocabulary embedding's (tied): that embedding node, in
  // `nodes` too; its output is all-reduced as well.
  core::NodeId tiedEmbedding = core::kNoNode;
};

std::vector<ShardPattern> findShardPatterns(const core::Graph& graph);

// An operator's name without its overload (`aten::linear.default` -> `aten::linear`).
std::string baseKind(const std::string& kind);
// A linear node of Note [Tensor-parallel patterns], and its activation (first BATCH input; -1).
bool isLinearNode(const core::Graph& graph, core::NodeId node);
core::ValueId linearActivation(const core::Graph& graph, core::NodeId node);

// Sets b.request.shardable from `patterns` (findShardPatterns(graph)'s), and the blocks'
// replicatedWorkingBytes. `groupCost` are the atomic groups' costs (calibrated) in b.groups'
// order, `groupWorking` their working bytes as the blocks count them.
void addShardableSpans(const core::Graph& graph, const core::GraphProfile& profile,
                       const std::vector<ShardPattern>& patterns,
                       const std::vector<BlockCost>& groupCost,
                       const std::vector<core::LinearCost>& groupWorking, Blocking& b);

}  // namespace autostage::decomposer
