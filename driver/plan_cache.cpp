// The plan cache; see plan_cache.h.
#include "driver/plan_cache.h"

#include <filesystem>
#include <sstream>

#include "core/config.h"
#include "core/error.h"
#include "core/ir/graph.h"
#include "core/log.h"
#include "core/proto/deployment_file.h"

namespace autostage::driver {

// Note [Plan cache]
// With plan_cache_dir set, rank 0 keeps every deployment it plans in that directory under a key
// of what the plan depends on: the graph hash (model and traced shapes), the job (world size,
// ranks per node, device kind and memory: Note [Resolving the job] in job.h), global batch, the
// plan's usage (Note [Plan usage]) and the value of every plan input of the option table (Note
// [Plan inputs] in core/config.h). A later launch with the same key loads the file instead of
// profiling and planning. A cache file that cannot be read (damaged, older format) is reported
// and replaced by a fresh plan.

std::string planCachePath(const std::string& graphHash, const JobSpec& job, int64_t globalBatch,
                          core::PlanUsage usage, const core::Config& config) {
  const std::string dir = config.getString("plan_cache_dir");
  if (dir.empty()) return "";
  std::ostringstream key;
  const int worldSize = job.worldSize;
  key << graphHash << '\n' << worldSize << '\n' << job.ranksPerNode << '\n' << globalBatch
      << '\n' << core::usageName(usage) << '\n' << job.deviceKind << '\n' << job.deviceMemory();
  for (const std::string& option : core::planInputOptions())
    key << '\n' << option << '=' << config.text(option);
  return dir + "/plan-" + graphHash + "-np" + std::to_string(worldSize) + "-b" +
         std::to_string(globalBatch) + "-" + core::usageName(usage) + "-" +
         core::fnv1aHex(key.str()).substr(0, 8) + ".deployment";
}

std::optional<core::Deployment> readCachedPlan(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::optional<core::Deployment> plan;
  try {
    plan = core::loadDeployment(path);
  } catch (const Error& e) {
    core::logger("DPStaging")->warn("Ignoring the cached plan {}: {}; planning again", path,
                                    e.what());
    return std::nullopt;
  }
  core::logger("DPStaging")->info("Loaded the plan from the plan cache: {} (plan_cache_dir); "
                                  "skipping profiling and planning", path);
  return plan;
}

void writeCachedPlan(const core::Deployment& deployment, const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  try {
    core::saveDeployment(deployment, path);
    core::logger("DPStaging")->info("Saved the plan to the plan cache: {}", path);
  } catch (const Error& e) {  // a cache that cannot be written must not fail the job
    core::logger("DPStaging")->warn("Could not save the plan to the plan cache ({}): {}", path,
                                    e.what());
  }
}

}  // namespace autostage::driver
