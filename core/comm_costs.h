#pragma once
// The communication costs the config table gives (comm_latency, comm_bandwidth,
// allreduce_bandwidth): what planning assumes where nothing was measured (one rank,
// measure_comm=false, the command-line planner, a synthetic model).

#include "core/config.h"
#include "core/profile.h"

namespace autostage::core {

// Point-to-point links at comm_bandwidth, allreduce at allreduce_bandwidth (bus bandwidth), both
// with comm_latency, the same within and between nodes; measured = false.
CommProfile configuredCommProfile(const Config& config);

}  // namespace autostage::core
