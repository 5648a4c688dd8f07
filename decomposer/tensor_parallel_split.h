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
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/ir/graph.h"
#include "decomposer/tensor_parallel_patterns.h"

namespace autostage::decomposer {

// Parameter `param` is held in slices: dimension `dim` holds `sections` equal parts (1, or the
// parts of a fused projection), each cut into `degree` equal slices; member j holds slice j of
// each part, concatenated.
struct ParamShard {
  core::ValueId param = -1;
  int dim = 0;
  int sections = 1;
};

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
  std::map<core::ValueId, core::NodeId> paramOrigin;  // a column linear's own weight/bias: sections follow it
  std::map<core::NodeId, int> sections;         // column linear -> parts (fused projection)
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
  // staging/gradient_sync.h).
  std::set<core::ValueId> partial;
  // Note [Whole K/V heads]: column linears kept whole (their activation through tp_copy, their
  // parameters in `partial`), the values computed from them alone, and the operands sliced to
  // the member's part of the split they meet: (node, input index) -> the split taken
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
// is. A view or expand of a whole value keeps its sizes, but for a size computed at run time,
// which becomes its recorded constant (it could read a split tensor's size).

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
