// Pipeline time estimates; see Note [1f1b pipeline estimate] in pipeline_time.h.
#include "decomposer/pipeline_time.h"

#include <algorithm>
#include <array>

namespace autostage::decomposer {
namespace {

// The i-th operation of a 1f1b stage with `warmup` warm-up forwards: true for a forward, with its
// micro-batch in *microBatch.
bool oneFOneBOp(int position, int warmup, int microBatches, int* microBatch) {
  if (position < warmup) return *microBatch = position, true;
  const int steady = position - warmup;
  if (steady < 2 * (microBatches - warmup)) {
    *microBatch = steady % 2 == 0 ? warmup + steady / 2 : steady / 2;
    return steady % 2 == 0;
  }
  *microBatch = position - microBatches;
  return false;
}

}  // namespace

double chainOneFOneB(const StageTimes* stages, const int* warmups, int count, int microBatches) {
  // Finish times per (stage, micro-batch); the stages advance in turn as far as their inputs allow.
  thread_local std::vector<double> forwardDone, backwardDone;
  forwardDone.assign(static_cast<size_t>(count) * microBatches, -1);
  backwardDone.assign(forwardDone.size(), -1);
  std::array<int, kOneFOneBWindow> next{};
  std::array<double, kOneFOneBWindow> freeAt{};
  const int ops = 2 * microBatches;
  for (int done = 0, before = -1; done != before;) {  // until no stage can advance
    before = done;
    for (int s = 0; s < count; ++s) {
      double* forward = &forwardDone[static_cast<size_t>(s) * microBatches];
      double* backward = &backwardDone[static_cast<size_t>(s) * microBatches];
      for (int mb; next[s] < ops; ++next[s], ++done) {
        const bool isForward = oneFOneBOp(next[s], warmups[s], microBatches, &mb);
        const double ready = isForward ? (s > 0 ? forward[mb - microBatches] : 0)
                                       : (s + 1 < count ? backward[mb + microBatches] : forward[mb]);
        if (ready < 0) break;
        freeAt[s] = std::max(freeAt[s], ready) + (isForward ? stages[s].forward : stages[s].backward);
        (isForward ? forward : backward)[mb] = freeAt[s];
      }
    }
  }
  return backwardDone[microBatches - 1];
}

double oneFOneBWindowPath(const OneFOneBSuffix& suffix, const StageTimes& stage, int microBatches) {
  // This stage and up to kOneFOneBWindow - 1 following ones (a longer chain's longest path is
  // never shorter, so only the longest window counts).
  const int count = 1 + std::min(suffix.stages, kOneFOneBWindow - 1);
  if (count == 1) return 0;
  std::array<StageTimes, kOneFOneBWindow> window{stage};
  std::array<int, kOneFOneBWindow> warmups{oneFOneBWarmup(suffix.stages, microBatches)};
  for (int i = 1; i < count; ++i) {
    window[i] = suffix.head[i - 1];
    warmups[i] = oneFOneBWarmup(suffix.stages - i, microBatches);
  }
  return chainOneFOneB(window.data(), warmups.data(), count, microBatches);
}

OneFOneBSuffix prependOneFOneB(const OneFOneBSuffix& suffix, const StageTimes& stage, int microBatches,
                               bool includeWindow) {
  const int m = microBatches;
  const int warmup = oneFOneBWarmup(suffix.stages, m);
  const double t = stage.total(), r = suffix.sum;
  double x = std::max(m * t, r + m * t - warmup * std::min(stage.forward, stage.backward));
  const int trips = (m - 1) / (warmup + 1) + 1;
  if (trips >= 2) x = std::max(x, trips * r + (m - (trips - 1) * warmup) * t);
  if (includeWindow) x = std::max(x, oneFOneBWindowPath(suffix, stage, m));
  OneFOneBSuffix result;
  result.sum = r + t;
  result.longest = std::max(x, t + suffix.longest);
  if constexpr (kOneFOneBWindow > 1) {
    result.head[0] = stage;
    for (int i = 1; i < kOneFOneBWindow - 1; ++i) result.head[i] = suffix.head[i - 1];
  }
  result.stages = suffix.stages + 1;
  return result;
}

double estimatePipelineSeconds(const std::vector<StageTimes>& stages, int microBatches, Schedule schedule) {
  if (schedule == Schedule::GPipe) {
    // Two flow shops of identical jobs (all forwards, then all backwards): exact.
    double sum = 0, maxForward = 0, maxBackward = 0;
    for (const StageTimes& s : stages) {
      sum += s.total();
      maxForward = std::max(maxForward, s.forward);
      maxBackward = std::max(maxBackward, s.backward);
    }
    return sum + (microBatches - 1) * (maxForward + maxBackward);
  }
  OneFOneBSuffix suffix;
  for (auto it = stages.rbegin(); it != stages.rend(); ++it) suffix = prependOneFOneB(suffix, *it, microBatches);
  return suffix.longest;
}

}  // namespace autostage::decomposer
