#pragma once
// The order in which one rank runs the forward and backward operations of its stages: the one
// definition the runtime (staging/executor.cpp) executes and the planner's simulator
// (decomposer/simulator.cpp) times, so the plan that is simulated is the plan that runs.
//
// Note [Pipeline schedules]
// A deployment of S * v stages runs on S *pipeline positions*; with v virtual stages (chunks)
// per position, position p holds stages p, p + S, ..., p + (v - 1) S (the ranks of stage k are
// the ranks of stage k mod S). Every replica of a position runs the same order. Chunk c of
// position p is stage c * S + p. With M micro-batches:
//   gpipe (v = 1 only)  every forward F(m), m = 0..M-1, then every backward B(m) in the same order
//                       (backward() runs them in reverse; the 1f1b-only parts need none).
//   1f1b, v = 1         w = min(S - p - 1, M) warm-up forwards, then F(w + i), B(i) alternating,
//                       then the remaining backwards (PipeDream-flush / Megatron's 1F1B).
//   1f1b, v > 1         Megatron's interleaved 1F1B: the M * v chunk-forwards run in groups of S
//                       micro-batches, chunk by chunk: the k-th forward is chunk (k mod S v) / S
//                       of micro-batch (k / (S v)) S + k mod S; the k-th backward the same with
//                       the chunk order reversed (chunk v - 1 first). Position p warms up with
//                       w = (S - p - 1) * 2 + (v - 1) S forwards (all M v when M == S), then
//                       alternates forward and backward, then drains. M must be a multiple of S
//                       (the groups are whole), and S >= 2 (one position has nothing to
//                       interleave with).
// A forward of stage k and micro-batch m needs the forwards of m of the stages before k; a
// backward needs the backwards of m of the stages after k (and its own forward). With sends that
// never block and receives that do, an order is deadlock-free when, running every position's
// order with those dependencies, every position finishes: pipeline_schedule_test.cpp checks that
// for S = 2..8, v = 1, 2, 4 and every valid M up to 4 S, with a dependency on *every* earlier
// (later) stage, so routes that skip stages cannot deadlock either. Interleaving shrinks the
// bubble from (S - 1) / M stage-times to (S - 1) / (v M) at the price of v times as many
// point-to-point transfers and more activations in flight: position 0 holds up to
// w + 1 = (v + 1) S - 1 chunk-activations of about 1/v of its layers each, ~(1 + 1/v) S
// micro-batches' worth against S without interleaving (the planner counts them exactly by
// replaying this order, decomposer/simulator.h).

#include <string>
#include <vector>

namespace autostage::core {

struct PipelineOp {
  bool forward = true;
  int chunk = 0;  // 0..v-1: stage chunk * positions + position
  int microBatch = 0;
  bool operator==(const PipelineOp& o) const {
    return forward == o.forward && chunk == o.chunk && microBatch == o.microBatch;
  }
};

// Empty when `schedule` ("gpipe" or "1f1b") can run `virtualStages` chunks on `positions`
// pipeline positions with `microBatches`; otherwise what is wrong and what to choose instead.
std::string pipelineShapeProblem(const std::string& schedule, int positions, int virtualStages,
                                 int microBatches);

// The operations of the rank at `position` (Note [Pipeline schedules]) in the order it runs them:
// each chunk's forward and backward of every micro-batch exactly once. Throws PlanError when
// pipelineShapeProblem is not empty.
std::vector<PipelineOp> pipelineOrder(const std::string& schedule, int position, int positions,
                                      int virtualStages, int microBatches);

// Warm-up forwards of `position` before its first backward (the held micro-batch count at the
// steady state, minus one, for v = 1).
int pipelineWarmup(const std::string& schedule, int position, int positions, int virtualStages,
                   int microBatches);

}  // namespace autostage::core
