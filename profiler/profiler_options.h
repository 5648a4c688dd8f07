#pragma once
// Options of the profiler (profileGraph, calibrate): filled from the config table
// (profile_* keys), validated once, logged once at start. Torch-free.

#include <cstdint>
#include <string>
#include <vector>

#include "core/precision.h"

namespace autostage::profiler {

// Most timing passes per batch size (ProfilerOptions::passes, passSeconds).
constexpr int kMaxPasses = 16;

struct ProfilerOptions {
  // Micro-batch sizes to measure each node at (>= 2 distinct for the linear fit). Empty: a
  // quarter and a half of the example batch (see resolveBatchSizes).
  std::vector<int64_t> batchSizes;
  int warmupRuns = 1;   // untimed runs before the timed ones (>= 1; the first records memory)
  // Scale times by a reference kernel's slowdown (Note [Load normalization], node_runner.cpp).
  bool normalizeLoad = false;
  int repeats = 3;      // timed runs per pass (>= 3); each pass keeps their median
  // Passes through the model, each timing every node group `repeats` times; a figure is the
  // smallest pass median (Note [Measurement passes] in node_runner.h). Calibration measures its
  // blocks in as many passes.
  int passes = 3;
  // More passes (at most kMaxPasses) are added until the passes at one batch size span this
  // many seconds: a short profile would otherwise fall into one slow stretch.
  double passSeconds = 1.5;
  // Later passes re-time the measured node groups from their inputs, kept from the first pass;
  // when these exceed this many bytes, a batch size is timed in one pass.
  double keptArgsBytes = 2.0 * (1 << 30);
  // Real multi-node blocks measured to fit the calibration factor (0: no calibration).
  int calibrationBlocks = 4;
  int calibrationRepeats = 3;  // timed runs of each calibration block per pass (>= 3)
  // Smallest forward+backward time a calibration block should have (seconds).
  double calibrationMinSeconds = 2e-3;
  uint64_t seed = 1;
  // Directory of cached profiles (empty: none); a file there is named by its profile key
  // (Note [Profile key] in profiler.h). cacheFile, when set, names the cache file directly (wins over cacheDir).
  std::string cacheDir;
  std::string cacheFile;
  double optParamFactor = 2;  // optimizer state bytes per parameter byte (for predictions)
  // Measure only the first of identical node groups and reuse its figures for the others
  // (Note [Identical node groups], profiler.cpp).
  bool reuseIdenticalGroups = true;
  // Live progress bar on stderr (only when it is a terminal).
  bool progressBar = true;
  // Nodes run under the stages' autocast (config key precision), so times and bytes are those
  // of the mixed-precision stages; part of the profile cache key (as the dtype's suffix).
  core::Precision precision = core::Precision::Fp32;
  // Tensor-parallel degrees (2, 4, 8) at which the split patterns' node groups are measured on
  // one member's slices as well (Note [Tensor-parallel profile] in split_profile.h); set by the
  // driver from the option tensor_parallel, part of the profile key when not empty.
  std::vector<int> splitDegrees;

  // Throws ConfigError naming the bad field, what came and what would be valid.
  void validate() const;
  std::string toString() const;
  // The options that change what is measured (not where it is cached, nor the batch sizes,
  // which the profile key names resolved): part of the profile key (Note [Profile key]).
  std::string measurementText() const;
  // From the global config: profile_cache_dir, profile_batch_sizes, profile_repeats,
  // profile_passes, profile_calibration_blocks, opt_param_factor, precision.
  static ProfilerOptions fromConfig();
};

// Parses "4,8, 16" into sizes; throws ConfigError naming `origin` on anything else.
std::vector<int64_t> parseBatchSizes(const std::string& text, const std::string& origin);

}  // namespace autostage::profiler
