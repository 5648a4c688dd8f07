#pragma once
// Communication profile: latency + bytes/bandwidth of point-to-point transfers and allreduce,
// intra-node and inter-node, measured with a comm::Backend when several ranks run, or taken
// from the configuration (comm_latency, comm_bandwidth, allreduce_bandwidth) otherwise. The
// planner reads bandwidths only from a CommProfile, never from constants.

#include <cstdint>
#include <string>

#include "comm/backend.h"
#include "core/profile.h"

namespace autostage::profiler {

struct CommProfileOptions {
  int64_t minBytes = 1024;              // 1 KiB
  int64_t maxBytes = 64 * 1024 * 1024;  // 64 MiB
  int sizeFactor = 4;                   // message sizes minBytes * factor^k up to maxBytes
  int repeats = 3;                      // timed runs per size (median), after one warm-up
  // Name of this rank's host; ranks with equal names count as one node. Empty: gethostname().
  std::string hostName;

  void validate() const;  // ConfigError naming the bad field
  std::string toString() const;
};

// The configured fallbacks (measured = false): every link gets comm_latency and comm_bandwidth
// (allreduce: allreduce_bandwidth).
core::CommProfile configuredCommProfile();

// Collective over the backend's world: every rank must call it; all get the same result. With
// one rank (or no backend) returns configuredCommProfile(). Link kinds with no rank pair to
// measure (e.g. inter-node on a single host) keep the configured values.
core::CommProfile profileComm(comm::Backend* backend,
                              const CommProfileOptions& options = CommProfileOptions());

// Least-squares latency + bytes/bandwidth fit of (bytes, seconds) samples; latency >= 0.
core::LinkCost fitLink(const std::vector<double>& bytes, const std::vector<double>& seconds);

}  // namespace autostage::profiler
