#pragma once
// Runs one deployment on this rank: micro-batching, routing, the gpipe, 1f1b and interleaved
// 1f1b schedules (the order of core/pipeline_schedule.h; a rank may hold several stages, one per
// virtual stage of its pipeline position) and gradient synchronisation. Every public step is collective over the world: all ranks call it
// in the same order (ranks holding no stage still feed their rows and receive their outputs).
//
// Note [Loss outputs]
// A graph output that is a scalar (a LOSS value, e.g. a mean-reduced loss computed inside the
// model) is produced once per micro-batch replica piece p of n_p rows. The runtime returns on
// every rank  sum_p (n_p / B) * loss_p , which equals the loss over the global batch B for a
// mean-reduced loss (what plain PyTorch computes on the concatenated batch). In backward the
// gradients passed on the ranks are averaged (so calling loss.backward() on every rank counts
// once) and piece p receives  mean_gradient * n_p / B. Scalar outputs that are not means (sums,
// counts) are therefore rescaled too: return per-sample values instead when that matters.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/backend.h"
#include "core/deployment.h"
#include "frontend/torchscript/importer.h"
#include "staging/checkpoint.h"
#include "staging/event_trace.h"
#include "staging/gradient_sync.h"
#include "staging/memory_watch.h"
#include "staging/param_storage.h"
#include "staging/route_check.h"
#include "staging/row_transport.h"
#include "staging/stage_runner.h"
#include "staging/transfer_plan.h"

namespace autostage::staging {

struct ExecutorOptions {
  // Where this rank's stages run (the job's placement: Note [Device and transport] in
  // driver/placement.h). The model's parameters and buffers must already be there; rows,
  // gradients and losses the executor makes are made there.
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  int64_t gradientBucketBytes = 25 << 20;  // Note [Gradient scaling]
  bool synchronizeParams = true;           // copy rank 0's parameters at construction
  std::string traceDirectory;              // non-empty: record events (Note [Trace files])
  int traceSteps = 10;
  core::Precision precision = core::Precision::Fp32;  // stages run under autocast unless fp32
  std::shared_ptr<MemoryMeter> memoryMeter;  // Note [Measured memory]; null: not measured
  void validate() const;
  std::string toString() const;
};

// Gradient accumulation (RaNNC's delay_grad_allreduce): while set, backward and trainStep leave
// gradients local; Executor::allreduceGrads() sums them once. Process-wide, like RaNNC's flag.
void setDelayGradAllreduce(bool delay);
bool delayGradAllreduce();

class Executor {
 public:
  // Builds this rank's stage of a deployment verified for this job (Note [One verification] in
  // route_check.h) and, with synchronizeParams, copies rank 0's parameters (collective over the
  // world). `model` must outlive the executor.
  Executor(const torchscript::ImportedModel& model, VerifiedDeployment deployment,
           std::shared_ptr<comm::Backend> backend, ExecutorOptions options = {});
  ~Executor();  // writes an open trace step

  // gpipe forward of all micro-batches (the deployment's schedule must be gpipe). `inputs`: one
  // tensor per model input, this rank's local batch (dim 0), on the CPU or options.device (moved
  // there). Returns one tensor per graph output, on options.device: rows of this rank's local
  // batch, or the global loss for scalar outputs (Note [Loss outputs]). Autograd state is kept
  // for backward(). `agreed`: the caller already agreed on the call with every rank (Note
  // [Agreed inputs]), so the step makes no exchange of its own before it starts.
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs, bool agreed = false);
  // gpipe backward: `outputGrads` holds one gradient per graph output (undefined = zeros) as
  // seen by this rank's caller, on any device (moved to options.device). Back-propagates all micro-batches in reverse order, then sums
  // parameter gradients over their holders (Note [Gradient scaling]).
  void backward(const std::vector<at::Tensor>& outputGrads);
  // Forward+backward in the deployment's schedule (1f1b or gpipe) of a model whose every output
  // is a loss (gradient `lossScale` on each rank, as if every rank called (loss *
  // lossScale).backward(); Note [Dynamic loss scaling] in loss_scaler.h); returns the losses,
  // unscaled. Gradients as backward(). `agreed` as for forward().
  std::vector<at::Tensor> trainStep(const std::vector<at::Tensor>& inputs, double lossScale = 1.0,
                                    bool agreed = false);

  // Sums gradients over their holders now (what backward does unless delayGradAllreduce()).
  // Collective over the world.
  void allreduceGrads();
  // Scales every local gradient by min(1, maxNorm / (norm + 1e-6)) where norm is the global
  // gradient norm (Note [Global gradient norm]); returns the norm. Collective over the world.
  double clipGradNorm(double maxNorm);
  // Divides every local gradient by `scale` and returns the global norm of the result: not
  // finite when any rank's gradients hold an inf or NaN, the same value on every rank (Note
  // [Dynamic loss scaling]). Collective over the world.
  double unscaleGradients(double scale);
  // ZeRO-1 (Note [ZeRO-1] in gradient_sync.h): the pieces of parameters this rank's optimizer
  // steps (length 0: a sharded parameter it owns nothing of), and the all-gather of the stepped pieces into every replica's parameters (collective
  // over the world: every rank calls it after optimizer.step(); ranks without a sharded stage
  // return at once). Without ZeRO-1 the pieces are empty and gatherParams does nothing.
  std::vector<ShardPiece> zeroShards() const { return gradientSync_.shards(rank_, params_); }
  void gatherParams();
  // ZeRO-1: all-gathers the owned pieces of the summed gradients, so every replica's .grad holds
  // the whole gradient (collective like gatherParams; the optimizer still steps its pieces).
  void gatherGrads();

  const core::Deployment& deployment() const { return deployment_; }
  // The parameters this rank holds in tensor-parallel slices (Note [Tensor-parallel
  // parameters]), by state_dict name: how to cut a whole tensor into this rank's slice.
  struct HeldSlice {
    std::string name;
    ParamShard shard;
    int degree = 1;
    int index = 0;
    std::vector<int64_t> whole;  // the whole tensor's shape
    // The slice's tensor, whose storage the parameter uses while the slice is held: cut again
    // into the same storage (Executor::sliceHeldParameters), so views of it (ZeRO-1's pieces)
    // and its data_ptr stay valid across switches.
    at::Tensor data;
  };
  const std::vector<HeldSlice>& heldSlices() const { return heldSlices_; }
  // Every parameter this deployment holds in slices, on any rank, by name (what every rank knows
  // alike: Note [Sharing sliced parameters] in checkpoint.cpp).
  const SliceLayouts& sliceLayouts() const { return sliceLayouts_; }
  // Whether this deployment's tensor-parallel parameters are slices now (on every rank alike:
  // Note [Sharing sliced parameters] in checkpoint.cpp). They are from construction until
  // shareState hands them to another deployment (slicesJoined); sliceHeldParameters cuts this
  // rank's slices again from the whole tensors, or takes the slices another deployment left in
  // them (Note [Keeping slices across a switch]); nothing to do while held.
  bool slicesHeld() const { return slicesHeld_; }
  void slicesJoined() { slicesHeld_ = false; }
  void sliceHeldParameters();
  const ParamStorage& params() const { return params_; }
  // This rank's stage ids in pipeline order (several with virtual stages), empty when it holds
  // none; localStage() is the first, or -1.
  std::vector<int> localStages() const;
  int localStage() const { return local_.empty() ? -1 : local_.front().id; }
  // Batch geometry of the last step (throws before the first).
  const BatchLayout& layout() const;
  // This rank's memory in the last step against the plan (Note [Measured memory]); nullopt
  // without a memory meter or before the first step ended.
  const std::optional<StepMemory>& lastStepMemory() const { return memory_.last(); }
  // Bytes of the optimizer state of this rank's parameters (Note [Measured memory]).
  void setOptimizerStateBytes(int64_t bytes) { memory_.setOptimizerBytes(bytes); }
  // The event trace file of this rank, "" when trace_events is off.
  std::string tracePath() const { return trace_ ? trace_->path() : ""; }

 private:
  // Note [Agreed inputs]
  // Each step needs its local batch size, the same on every rank, and inputs of the traced
  // dtypes and shapes. Called alone (tests, the staging API) the executor agrees on them itself:
  // one all-gather per step (agreeLocalBatch). driver::Module has already agreed on the call
  // (Note [One agreement per call] in driver/module.h: every rank's inputs have the same dtypes
  // and shapes), so with `agreed` the check is local: it finds the same problem on every rank
  // or none, and the step makes no second exchange.
  void beginStep(const std::vector<at::Tensor>& inputs, bool agreed);
  // The tensors on options_.device (undefined ones stay undefined).
  std::vector<at::Tensor> onStageDevice(const std::vector<at::Tensor>& tensors) const;
  // Checks every rank's inputs and agrees on the local batch size; throws the same Error on
  // every rank when any rank's inputs are wrong or the sizes differ.
  int64_t agreeLocalBatch(const std::vector<at::Tensor>& inputs);
  // The same check of inputs already agreed across ranks, without an exchange.
  int64_t checkAgreedBatch(const std::vector<at::Tensor>& inputs) const;
  std::string describeInputProblem(const std::vector<at::Tensor>& inputs) const;
  // One stage this rank holds: its runner and the outputs each micro-batch's forward left for
  // its backward.
  struct LocalStage {
    int id = -1;
    int replicaIndex = -1;
    int member = 0;  // place in the replica's tensor-parallel group (Note [Tensor-parallel stages])
    std::unique_ptr<StageRunner> runner;
    std::vector<std::vector<at::Tensor>> outputs;  // per micro-batch
  };
  bool carriesGradient(size_t route) const;
  int outputIndex(const LocalStage& stage, core::ValueId value) const;
  void sendFeederRows(const std::vector<at::Tensor>& inputs);
  void forwardMicro(LocalStage& stage, int micro);
  void backwardMicro(LocalStage& stage, int micro);
  std::vector<at::Tensor> receiveCallerOutputs();
  void sendCallerGradients(const std::vector<at::Tensor>& outputGrads);
  std::vector<at::Tensor> reduceLosses();
  void averageLossGradients(const std::vector<at::Tensor>& outputGrads);
  void finishBackward();
  void shardParameters();  // Note [Tensor-parallel parameters]
  void endStepMemory();  // closes the step's memory window (Note [Measured memory])
  SampleRange myRows(const LocalStage& stage, int micro) const;
  at::Tensor allocateRows(core::ValueId value, int64_t rows) const;
  bool inferenceOnly() const;  // planned for a forward under no_grad (Note [Plan usage])

  const torchscript::ImportedModel& model_;
  core::Deployment deployment_;
  std::shared_ptr<comm::Backend> backend_;
  ExecutorOptions options_;
  int rank_;
  int position_ = -1;              // pipeline position (Note [Pipeline schedules]), -1: none
  std::vector<LocalStage> local_;  // ascending stage ids: chunk c of the position is local_[c]
  std::vector<RouteKind> routeKinds_;  // per route
  std::vector<int> outputRoutes_;      // per graph output: its route index
  ParamStorage params_;               // the parameters of every local stage
  GradientSync gradientSync_;
  RowTransport transport_;
  std::optional<BatchLayout> layout_;
  std::optional<TransferPlan> plan_;
  // Parameters a local tensor-parallel stage reads whole, with its degree: every member computes
  // the same gradient, which allreduceGrads divides by the degree before summing over holders
  // (Note [Tensor-parallel gradients] in gradient_sync.h).
  std::map<core::ValueId, int> replicatedInGroup_;  // once per parameter (virtual stages)
  std::vector<HeldSlice> heldSlices_;
  SliceLayouts sliceLayouts_;
  bool slicesHeld_ = false;
  // Broadcasts the leader's output gradients of `stage` to its tensor-parallel group.
  void shareOutputGradients(const LocalStage& stage, int micro, std::vector<at::Tensor>& grads);
  std::vector<double> lossSums_;       // per route: this rank's weighted loss pieces
  std::vector<double> lossGradients_;  // per route: averaged caller gradient of a loss
  std::unique_ptr<EventTrace> trace_;  // null unless tracing
  MemoryWatch memory_;
};

}  // namespace autostage::staging
