#pragma once
// Whether, and how, a tensor-parallel pattern (Note [Tensor-parallel patterns] in
// tensor_parallel_patterns.h) splits over a group of `degree` ranks: the split dimension of each
// value, the sizes rewritten and the parameter slices (Note [Tensor-parallel stages] in
// staging/tensor_parallel.h, which rewrites a stage by these plans), or why the pattern stays
// replicated. Torch-free: the planner asks the same question, of the whole graph, for each
// degree it searches (ShardableSpan::degrees), so it counts a pattern split only where the
// runtime splits it (short of a reason only a stage's cut gives, such as sizes built in another
// stage).

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/ir/graph.h"
#include "decomposer/tensor_parallel_patterns.h"

namespace autostage::decomposer {

// One part of a parameter along its sliced dimension (Note [Fused parts]): `size` indices of
// the whole parameter, cut into `degree` equal slices, or with `whole` held whole by every member.
struct ShardPart {
  int64_t size = 0;
  bool whole = false;
  bool operator==(const ShardPart& o) const { return size == o.size && whole == o.whole; }
};
std::ostream& operator<<(std::ostream& out, const ShardPart& part);  // "16" or "16 whole"

// Parameter `param` is held in slices: dimension `dim` holds `parts` in order (empty: one part,
// cut), the parts of a fused projection; member j holds slice j of each cut part and every whole
// part, concatenated in the same order.
struct ParamShard {
  core::ValueId param = -1;
  int dim = 0;
  std::vector<ShardPart> parts;
};

// `shard`'s parts of a parameter of `extent` indices along its dimension (its one cut part where
// it names none).
std::vector<ShardPart> partsOf(const ParamShard& shard, int64_t extent);
// What a member holds of `parts` (the sum of the whole parts and the cut ones' slices).
int64_t memberExtent(const std::vector<ShardPart>& parts, int degree);

// A value split over the group: dimension `dim` is `outer` repetitions of a block of `size`
// indices, each block cut into `degree` contiguous slices; a member holds slice j of every block.
struct Split {
  int dim = 0;
  int64_t size = 0;
  core::NodeId origin = core::kNoNode;  // the column-parallel linear it comes from
};

// A size argument rewritten: entry -> value (entry -1: the argument is one int).
using Rewrite = std::map<int, int64_t>;

// How one pattern is split (Note [Tensor-parallel stages] in staging/tensor_parallel.h).
struct PatternPlan {
  std::map<core::ValueId, Split> split;
  std::map<std::pair<core::NodeId, int>, Rewrite> rewrites;  // (node, input index)
  std::map<core::ValueId, ParamShard> params;
  // A column linear's own weight and bias -> the linear: they take its parts.
  std::map<core::ValueId, core::NodeId> paramOrigin;
  // A fused column linear -> its parts (Note [Fused parts]), in the order of its output features.
  std::map<core::NodeId, std::vector<ShardPart>> parts;
  std::set<core::NodeId> columns;
  core::NodeId row = core::kNoNode;
  core::NodeId embedding = core::kNoNode;  // a vocabulary embedding, run as tp_embedding
  // An LM head's log-softmax and loss over the split vocabulary -> the tp_ operator run instead
  // (Note [Vocabulary-parallel loss] in staging/tensor_parallel_ops.h).
  std::map<core::NodeId, const char*> vocabularyOps;
  std::vector<core::NodeId> nodes;  // the pattern's
  // Whole parameters the pattern reads broadcast over the split dimension (a learnable scale of
  // each head's features): a member's gradient of one is its heads' share, so the group sums
  // them rather than taking one member's (Note [Tensor-parallel gradients] in
  // staging/gradient_sync.h); so too the parameters such an operand is computed from by nodes
  // outside the pattern (Note [Parameters computed into an operand] in tensor_parallel_split.cpp).
  std::set<core::ValueId> partial;
  // Note [Whole K/V heads]: column linears kept whole (their activation through tp_copy, their
  // parameters in `partial`), the values computed from them alone, and the operands sliced to
  // the member's part of the split they meet (those, and constants read with the split
  // dimension's full extent: ALiBi's slopes): (node, input index) -> the split taken
  // (autostage::tp_slice).
  std::set<core::NodeId> wholeColumns;
  std::set<core::ValueId> whole;
  std::map<std::pair<core::NodeId, int>, Split> slices;
};

// Note [Whole K/V heads]
// Grouped-query and multi-query attention (Llama's, Mistral's, Gemma's, Qwen2's K/V heads) has
// fewer K and V heads than Q heads; where those do not divide by the degree, their projections
// cannot be cut by heads. As Megatron-LM does, each member then computes K and V whole: a column
// linear of the attention narrower than the widest (Q's) is kept whole when the pattern does not
// split with every column cut. Its activation goes through the same tp_copy as Q's and its
// weight and bias are partial (each member's gradient of them is its heads' share; the group
// sums them). Every value computed from whole values and no split one is whole (any operator:
// it runs as it is, the same on every member); what else such a node reads must broadcast as a
// split node's operand does (masks, position factors, parameters the pattern alone reads, then
// partial). Where a whole value meets a split one (the scores' matmul, sdpa) with the split
// dimension's full extent (K and V repeated to every Q head), it is sliced to the member's part
// by autostage::tp_slice (a narrow, whose backward fills the other heads' gradient with zeros);
// where it broadcasts over that dimension (one K/V head read by every Q head) it is read as it
// is; sdpa with enable_gqa reads K and V of fewer heads than Q, sliced to the heads the member's Q
// heads read (Note [Grouped sdpa] in tensor_parallel_split.cpp). A view or expand of a whole
// value keeps its sizes, but for a size computed at run time, which becomes its recorded
// constant (it could read a split tensor's size).

// Note [Fused parts]
// A fused projection computes several groups of heads or features with one linear node: GPT-2's
// c_attn (Q, K and V of equal width), Phi-3's qkv_proj (Q, then K and V of fewer heads under
// grouped-query attention, cut apart by slices), GPT-BigCode's c_attn (Q, then one K/V head:
// split_with_sizes), Phi-3's gate_up_proj (the gate and up halves of a gated MLP: chunk). Where
// its output is cut into parts along the split dimension (aten::split, split_with_sizes or
// chunk, or aten::slice nodes of constant bounds tiling it), each part is split on its own: a
// member holds slice j of each part's rows (ParamShard::parts), and the parts' sizes or slice
// bounds are rewritten to the member's. A part narrower than the widest (K and V of fewer heads
// than Q) is kept whole when the pattern does not split with every part cut, as Note [Whole K/V
// heads] keeps a separate K/V projection whole: every member holds its rows whole, its output
// part is whole, and the rows' gradient on a member is its heads' share, summed over the group
// (a piece of rows of the parameter: Note [Tensor-parallel gradients] in
// staging/gradient_sync.h; so such a parameter is sliced along its rows, dimension 0, and ZeRO-1
// leaves it whole). Unequal or whole parts must be cut from the linear's output features
// themselves (its last dimension, in one block: no view into heads before the cut, which could
// interleave them); equal cut parts may follow such a view (GPT-NeoX's layout). A view may make
// the cut itself: one giving the features a leading dimension of their own (ModernBERT's Wqkv
// viewed into (3, heads, features), then unbound into Q, K and V) cuts them into that many equal
// parts, split by the heads that follow. The value cut must be read by the cut alone.

// The plans of the patterns a stage holding `nodes` (sorted) shards at `degree`; one line per
// pattern it holds that stays replicated, with the reason, goes to `skipped`.
std::vector<PatternPlan> planPatterns(const core::Graph& graph, const std::vector<core::NodeId>& nodes,
                                      int degree, std::vector<std::string>& skipped);

// Per pattern, the degrees of {2, 4, 8} at which it splits in a stage holding every node of
// `graph` (bit 1 << t: ShardableSpan::degrees), and per degree the lines, as planPatterns'
// `skipped`, of the patterns that stay replicated at it.
struct SplitDegrees {
  std::vector<unsigned> degrees;
  std::map<int, std::vector<std::string>> replicated;
  // Per pattern, its whole parameters (PatternPlan::partial) at the degrees it splits at.
  std::vector<std::set<core::ValueId>> partial;
  // Per pattern and degree, the nodes it runs whole at that degree (Note [Whole K/V heads]:
  // K's and V's projections and what is computed from them), whose compute and activations a
  // member does not divide.
  std::vector<std::map<int, std::set<core::NodeId>>> wholeNodes;
  // Per pattern, the share of a parameter's extent held whole by every member at some degree
  // it splits at (a fused projection's whole parts: Note [Fused parts]), by parameter.
  std::vector<std::map<core::ValueId, double>> wholeShare;
};
SplitDegrees splitDegrees(const core::Graph& graph, const std::vector<ShardPattern>& patterns);

// Node `n`'s operator is one of `kinds` (compared without the overload, as baseKind).
bool isKind(const core::Node& n, std::initializer_list<const char*> kinds);
// The value of an int constant; nullopt when `v` is computed at run time.
std::optional<int64_t> constantInt(const core::Graph& g, core::ValueId v);
// A None argument (TorchScript's NoneType constant; torch.export's constant without a value).
bool isNone(const core::Graph& g, core::ValueId v);
// Node `n` transposes a 2-D tensor: aten::t, aten::numpy_T (`w.T`, as Falcon's linear layers
// read their weights), aten::transpose of its two dimensions, aten::permute by [1, 0].
bool transposes2d(const core::Graph& g, core::NodeId n);

}  // namespace autostage::decomposer
