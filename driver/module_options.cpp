// ModuleOptions (driver/module.h): from the config table, checked, and as text for the log.
#include <sstream>

#include "core/config.h"
#include "core/error.h"
#include "driver/module.h"

namespace autostage::driver {

ModuleOptions ModuleOptions::fromConfig() {
  const core::Config& config = core::globalConfig();
  ModuleOptions options;
  options.allowReplan = config.getBool("allow_replan");
  if (config.getBool("trace_events")) options.traceDirectory = config.getString("trace_events_dir");
  options.traceSteps = static_cast<int>(config.getInt("trace_events_steps"));
  const std::string file = config.getString("deployment_file");
  const int64_t dryRun = config.getInt("partitioning_dry_run_np");
  const bool load = config.getBool("load_deployment"), save = config.getBool("save_deployment");
  const char* what = dryRun > 0 ? "partitioning_dry_run_np" : load ? "load_deployment=true"
                                                            : "save_deployment=true";
  AUTOSTAGE_CHECK_AS(ConfigError, !file.empty() || (dryRun <= 0 && !load && !save), what,
                     " needs deployment_file: set deployment_file to the path of the deployment "
                     "to ", load && dryRun <= 0 ? "load" : "write");
  AUTOSTAGE_CHECK_AS(ConfigError, dryRun >= 0 && dryRun <= (1 << 20),
                     "partitioning_dry_run_np must be 0 (off) or the number of ranks to plan "
                     "for, got ", dryRun);
  AUTOSTAGE_CHECK_AS(ConfigError, !(load && dryRun > 0),
                     "partitioning_dry_run_np plans and saves a deployment, load_deployment=true "
                     "loads one: set only one of them");
  if (load) options.deploymentPath = file;
  if (save || dryRun > 0) options.saveDeploymentPath = file;
  options.dryRunWorldSize = static_cast<int>(dryRun);
  options.precision = core::parsePrecision(config.getString("precision"));
  options.gradientBucketBytes = config.getInt("gradient_bucket_bytes");
  return options;
}

void ModuleOptions::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError, dryRunWorldSize <= 0 || !saveDeploymentPath.empty(),
                     "a dry run (partitioning_dry_run_np) needs a path to save the deployment to "
                     "(deployment_file)");
  AUTOSTAGE_CHECK_AS(ConfigError, gradientBucketBytes >= 1,
                     "gradient_bucket_bytes must be >= 1, got ", gradientBucketBytes);
}

std::string ModuleOptions::toString() const {
  std::ostringstream out;
  out << "backend=" << (backend ? backend->name() : std::string("mpi"))
      << " planner=" << (planner ? "callback" : "auto") << " tracer="
      << (tracer ? "callback" : "none") << " deployment_path='" << deploymentPath
      << "' gradient_bucket_bytes=" << gradientBucketBytes
      << " allow_replan=" << (allowReplan ? "true" : "false") << " save_deployment_path='"
      << saveDeploymentPath << "' dry_run_world_size=" << dryRunWorldSize
      << " precision=" << core::precisionName(precision);
  return out.str();
}

}  // namespace autostage::driver
