#pragma once
// The plan cache (Note [Plan cache]): deployments rank 0 planned, kept under a key of what the
// plan depends on, so a later launch of the same job skips profiling and planning.

#include <cstdint>
#include <optional>
#include <string>

#include "core/deployment.h"
#include "core/config.h"
#include "core/plan_usage.h"
#include "driver/job.h"

namespace autostage::driver {

// The cache file for this job's plan for `usage` under the plan options `config` ("" when
// plan_cache_dir is not set there).
std::string planCachePath(const std::string& graphHash, const JobSpec& job, int64_t globalBatch,
                          core::PlanUsage usage, const core::Config& config);

// The cached plan at `path`; none (with a warning when the file exists but cannot be read) when
// there is none to use.
std::optional<core::Deployment> readCachedPlan(const std::string& path);

// Saves `deployment` at `path`; a failure is logged, never thrown (a cache must not fail a job).
void writeCachedPlan(const core::Deployment& deployment, const std::string& path);

}  // namespace autostage::driver
