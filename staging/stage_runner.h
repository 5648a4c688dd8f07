#pragma once
// One stage of a deployment, executable on this rank: its nodes exported as a TorchScript
// function, fed per micro-batch with routed inputs and local parameters.
//
// Inputs of the exported function come from three places: routed batch values (received per
// micro-batch), parameters/buffers (ParamStorage) and parameter- or constant-derived values
// produced by nodes of other stages. The last kind never travels (Note [Routes]); the runner
// recomputes them with a *prelude*: the export of those values' ancestor nodes, run before the
// stage for every micro-batch (usually a few cheap ops such as a weight transpose), so their
// gradients reach the parameters through each micro-batch's own autograd graph.
//
// Note [Recompute]
// A recompute stage runs its forward without autograd, keeps only its routed inputs and the RNG
// states (the CPU's and, for tensors on CUDA, their devices': Note [Recompute RNG state] in
// staging/rng_state.h), and in backward restores those states, re-runs the forward with
// autograd and back-propagates; dropout masks therefore match (a tensor-parallel stage's too:
// Note [Tensor-parallel dropout] in staging/tensor_parallel_ops.h). The stage's buffers are
// restored after the re-run, so in-place buffer updates (BatchNorm running statistics,
// num_batches_tracked) happen once per micro-batch, as without recompute.
//
// Note [Tensor-parallel random operators]
// The members of a tensor-parallel group compute the stage's replicated activations in full
// (Note [Tensor-parallel stages] in staging/tensor_parallel.h). A random operator other than the
// dropouts the rewrite turns into tp_dropout (torch.randn_like noise, bernoulli, ...) draws from
// the rank's default generators, which differ between members, so its copies would part ways
// and so would the replicated parameters. When the stage has such operators
// (ShardedStage::ownRandom), every run of it -- forward, and a recompute stage's re-run --
// seeds the default generators of its devices (the CPU's, and its CUDA devices') with the next
// seed of the group's stream (TensorParallelGroup::nextSeed: the same on every member, the
// stream's draw count its state, which a recompute stage restores for the re-run) and puts the
// rank's own states back afterwards. The members then draw the same numbers; an operator on a
// split activation draws the same numbers for each member's slice (only dropout, through
// tp_dropout, gets a member's own). Without such operators the generators are left alone.
//
// With a mixed precision (core/precision.h) every run of the stage's functions -- forward and a
// recompute stage's re-run alike -- happens inside its own autocast region (Note [Autocast
// execution], Note [Autocast cache] in frontend/torchscript/autocast.h).

#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/deployment.h"
#include "core/precision.h"
#include "core/ir/graph.h"
#include "frontend/torchscript/exporter.h"
#include "staging/param_storage.h"
#include "staging/rng_state.h"
#include "staging/tensor_parallel.h"
#include "staging/tensor_parallel_ops.h"

namespace autostage::staging {

// Graph parameter inputs (ParamStorage ids) that `stage` reads, including through its prelude.
std::vector<core::ValueId> stageParams(const core::Graph& graph,
                                       const core::StageDeployment& stage);

// A stage whose replicas are groups of ranks (Note [Tensor-parallel stages]): this rank's group.
struct TensorParallelMember {
  std::shared_ptr<comm::Backend> backend;
  comm::Group group;  // the replica's ranks, ascending
  int index = 0;      // this rank's place in the group
};

class StageRunner {
 public:
  // `gradientInputs` are the routed inputs whose gradient is sent back (carriesGradient routes).
  // `device`: where the stage runs, whose autocast a mixed precision turns on.
  StageRunner(const core::Graph& graph, const core::StageDeployment& stage,
              const ParamStorage& params, std::vector<core::ValueId> gradientInputs,
              core::Precision precision = core::Precision::Fp32,
              c10::DeviceType device = c10::DeviceType::CPU,
              std::optional<TensorParallelMember> tensorParallel = std::nullopt);

  // The parameter slices this rank holds (empty unless the stage is tensor-parallel) and the
  // patterns that stayed replicated (Note [Tensor-parallel stages]).
  const std::vector<ParamShard>& shards() const { return shards_; }
  // Whole parameters whose gradient is this member's heads' share (ShardedStage::partial).
  const std::vector<core::ValueId>& partialParams() const { return partial_; }
  const std::vector<std::string>& replicatedPatterns() const { return replicated_; }
  // Random operators the runner seeds alike on every member (Note [Tensor-parallel random
  // operators]).
  int seededRandomOperators() const { return ownRandom_; }

  const core::StageDeployment& stage() const { return stage_; }
  // Routed values the stage reads (batch values from the feeder or other stages).
  const std::vector<core::ValueId>& routedInputs() const { return routedInputs_; }
  // Boundary outputs of the stage, in the order forward() returns them.
  const std::vector<core::ValueId>& outputs() const { return function_.outputs(); }

  // Runs micro-batch `micro` on `inputs` (one tensor per routedInputs() value) and returns the
  // outputs, detached from autograd. Keeps what backward(micro) needs.
  std::vector<at::Tensor> forward(int micro, const std::unordered_map<core::ValueId, at::Tensor>& inputs);
  // Back-propagates `outputGrads` (one per outputs() entry; undefined = no gradient) through
  // micro-batch `micro`, accumulating parameter gradients, and returns the gradient of every
  // gradientInputs value (zeros when it did not influence the outputs). Releases the micro-batch.
  std::unordered_map<core::ValueId, at::Tensor> backward(int micro,
                                                         const std::vector<at::Tensor>& outputGrads);
  // Drops all kept micro-batch state (e.g. after an error or a forward without backward).
  void clear() { saved_.clear(); }

 private:
  struct Saved {
    std::unordered_map<core::ValueId, at::Tensor> inputs;  // leaves (recompute: detached)
    std::vector<at::Tensor> outputs;                        // with autograd history
    std::optional<RngStates> rngStates;                     // recompute stages only
    uint64_t groupDraws = 0;  // recompute tensor-parallel stages: the group's stream
  };
  // The devices of the stage's routed `inputs` and of the parameters it reads.
  std::vector<c10::Device> tensorDevices(
      const std::unordered_map<core::ValueId, at::Tensor>& inputs) const;
  std::vector<at::Tensor> run(const std::unordered_map<core::ValueId, at::Tensor>& inputs);
  torchscript::ExportedFunction makeFunction(const core::Graph& graph,
                                             const std::optional<TensorParallelMember>& tp);
  std::unordered_map<core::ValueId, at::Tensor> makeLeaves(
      const std::unordered_map<core::ValueId, at::Tensor>& inputs) const;

  core::StageDeployment stage_;
  const ParamStorage& params_;
  std::unique_ptr<TensorParallelGroup> group_;  // before function_: the graph names its handle
  std::vector<ParamShard> shards_;
  std::vector<core::ValueId> partial_;
  std::vector<std::string> replicated_;
  int ownRandom_ = 0;  // Note [Tensor-parallel random operators]
  torchscript::ExportedFunction function_;
  std::unique_ptr<torchscript::ExportedFunction> prelude_;
  std::vector<core::ValueId> routedInputs_;
  std::vector<core::ValueId> gradientInputs_;
  core::Precision precision_;
  c10::DeviceType device_;
  std::map<int, Saved> saved_;
};

}  // namespace autostage::staging
