#pragma once
// Planning for hardware we do not have: rescales a profile measured here to a target device of
// a cluster spec by the ratio of peak FLOP/s, and labels it estimated. Torch-free.

#include "core/cluster_spec.h"
#include "core/profile.h"

namespace autostage::profiler {

// Times are multiplied by sourcePeakFlops / target.peakFlops (memory figures are unchanged);
// deviceKind becomes "estimated:<target kind>" and `estimated` is set. The comm part is
// replaced by the spec's latency and bandwidths (intra/inter node; allreduce likewise).
// Throws ConfigError when sourcePeakFlops <= 0 or the spec is invalid.
core::GraphProfile rescaleProfile(const core::GraphProfile& measured, double sourcePeakFlops,
                                  const core::ClusterSpec& target);

// Communication costs a cluster spec implies (measured = false).
core::CommProfile commProfileOf(const core::ClusterSpec& spec);

}  // namespace autostage::profiler
