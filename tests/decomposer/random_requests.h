#pragma once
// Random small plan requests for the decomposer tests (deterministic per seed).

#include <random>

#include "decomposer/plan.h"

namespace autostage::decomposer::testing {

// A request with `blocks` blocks on `devices` devices: random linear costs, cut sizes, parameter
// bytes (some parameters shared by two blocks), 1/2/4 devices per node, and a memory limit drawn
// between "too small for anything" and "everything fits".
inline PlanRequest randomRequest(std::mt19937& rng, int blocks, int devices) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto between = [&](double lo, double hi) { return lo + (hi - lo) * unit(rng); };
  PlanRequest r;
  r.devices = devices;
  r.devicesPerNode = std::vector<int>{1, 2, 4}[rng() % 3];
  r.batchSize = std::vector<int>{1, 4, 8, 16, 32, 48}[rng() % 6];
  r.comm.p2pIntraNode = {between(1e-6, 1e-4), between(5e10, 2e11)};
  r.comm.p2pInterNode = {between(1e-5, 1e-4), between(1e9, 2e10)};
  r.comm.allreduceIntraNode = {between(1e-5, 1e-4), between(5e10, 2e11)};
  r.comm.allreduceInterNode = {between(1e-5, 1e-4), between(1e9, 2e10)};
  double total = 0;
  for (int b = 0; b < blocks; ++b) {
    BlockCost c;
    c.name = "block" + std::to_string(b);
    c.forwardSeconds = {between(0, 2e-3), between(1e-4, 2e-3)};
    c.backwardSeconds = {c.forwardSeconds.fixed * between(1, 3), c.forwardSeconds.perSample * between(1, 3)};
    c.activationBytes = {between(0, 1e7), between(1e6, 5e7)};
    c.workingBytes = {between(0, 1e7), between(0, 1e7)};
    c.cutBytesAfter = {0, between(1e5, 2e7)};
    c.paramBytes = unit(rng) < 0.2 ? 0 : between(1e6, 4e8);
    total += c.paramBytes * 4 + c.activationBytes.at(r.batchSize) * 4;
    r.blocks.push_back(c);
  }
  if (blocks >= 2 && unit(rng) < 0.5) {
    int a = static_cast<int>(rng() % blocks), b = static_cast<int>(rng() % blocks);
    if (a != b) r.sharedParams.push_back({between(1e7, 5e8), {std::min(a, b), std::max(a, b)}});
  }
  r.deviceMemory = total * between(0.02, 1.2);
  r.options.maxPipeline = std::vector<int>{1, 2, 4, 8}[rng() % 4];
  r.options.memMargin = between(0, 0.2);
  r.options.optParamFactor = std::vector<double>{0, 1, 2}[rng() % 3];
  return r;
}

// What a harder instance stresses (Note [Simulated refinement]'s comparison covers each).
enum class Stress {
  kNone,
  kEmbeddings,     // first and/or last block embedding-heavy: most parameters, little compute
  kTightMemory,    // a memory limit near the smallest that fits
  kManyMicroBatches,  // batch 64..256, up to 32 micro-batches
};

// randomRequest, then made harder as `stress` says.
inline PlanRequest stressedRequest(std::mt19937& rng, int blocks, int devices, Stress stress) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto between = [&](double lo, double hi) { return lo + (hi - lo) * unit(rng); };
  PlanRequest r = randomRequest(rng, blocks, devices);
  switch (stress) {
    case Stress::kNone:
      break;
    case Stress::kEmbeddings: {
      const bool first = unit(rng) < 0.7, last = !first || unit(rng) < 0.5;
      for (int b : {0, blocks - 1}) {
        if ((b == 0 && !first) || (b == blocks - 1 && b != 0 && !last)) continue;
        BlockCost& c = r.blocks[b];
        c.paramBytes = between(2e9, 6e9);  // a large vocabulary's table
        c.forwardSeconds = {between(0, 2e-4), between(1e-5, 2e-4)};
        c.backwardSeconds = {c.forwardSeconds.fixed * 2, c.forwardSeconds.perSample * between(2, 4)};
        c.activationBytes = {0, between(5e7, 2e8)};  // logits
      }
      double total = 0;
      for (const BlockCost& c : r.blocks) total += c.paramBytes * 4;
      r.deviceMemory = total * between(0.3, 1.2);
      break;
    }
    case Stress::kTightMemory:
      r.deviceMemory *= between(0.15, 0.5);
      r.options.optParamFactor = 2;
      break;
    case Stress::kManyMicroBatches:
      r.batchSize = std::vector<int>{64, 128, 256}[rng() % 3];
      r.options.maxPipeline = std::vector<int>{16, 32}[rng() % 2];
      r.options.minPipeline = 4;
      for (BlockCost& c : r.blocks) c.forwardSeconds.fixed *= 0.1, c.backwardSeconds.fixed *= 0.1;
      r.deviceMemory *= between(2, 8);  // the batch grew; memory stays the question in kTightMemory
      break;
  }
  return r;
}

}  // namespace autostage::decomposer::testing
