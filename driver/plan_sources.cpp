// How a Module obtains a deployment (Note [Where a plan comes from]) and checks it once (Note [One
// verification]).
#include "driver/plan_sources.h"

#include <optional>
#include <sstream>

#include "comm/agreement.h"
#include "core/error.h"
#include "core/log.h"
#include "core/proto/deployment_file.h"
#include "driver/auto_planner.h"
#include "driver/module.h"
#include "staging/route_check.h"

namespace autostage::driver {

void logDeployment(const core::Deployment& d) {
  auto log = core::logger("DPStaging");
  const std::string usage = core::recordedUsage(d);
  log->info("Deployment: {} stage(s), {} micro-batch(es), schedule {}, world size {}, for {}",
            d.stages.size(), d.microBatchCount, d.schedule, d.worldSize,
            usage.empty() ? "(usage not recorded)" : usage);
  for (const core::StageDeployment& s : d.stages) {
    std::ostringstream ranks;
    for (size_t i = 0; i < s.ranks.size(); ++i) ranks << (i ? "," : "") << s.ranks[i];
    log->info("{}: {} nodes, replicas={} ranks={{{}}} recompute={} zero={}", s.name,
              s.nodes.size(), s.replicaCount(), ranks.str(), s.recompute, s.zero ? 1 : 0);
  }
  const std::string placed = core::stageHostsText(d);  // Note [Hosts in the log] in module.cpp
  if (!placed.empty()) log->info("Stages on hosts: {}", placed);
}

staging::VerifiedDeployment Module::obtainDeployment(const std::vector<c10::IValue>& examples,
                                                     int64_t globalBatch, core::PlanUsage usage) {
  if (options_.dryRunWorldSize > 0) {
    comm::runAgreed(*backend_, "planning (dry run)", [&] {
      if (backend_->rank() == 0) planDryRun(examples, globalBatch, usage);
    });
    const std::string message =
        "The dry run for partitioning finished: the deployment for " +
        std::to_string(options_.dryRunWorldSize) + " ranks is in " + options_.saveDeploymentPath +
        "; launch " + std::to_string(options_.dryRunWorldSize) +
        " ranks with load_deployment=true and deployment_file=" + options_.saveDeploymentPath;
    if (backend_->rank() == 0) core::logger("DPStaging")->info("{}. Exiting ...", message);
    throw DryRunFinished(message);
  }
  core::Deployment deployment;
  bool elsewhere = false;
  if (!options_.deploymentPath.empty() && deploymentCount_ == 0) {
    // 1. A saved deployment is for the first usage this module runs (Note [One deployment per
    // usage]); every rank reads it (the file must be where every rank sees it).
    core::logger("Module")->info("Loading deployment from {}", options_.deploymentPath);
    comm::runAgreed(*backend_, "loading the saved deployment",
                    [&] { deployment = core::loadDeployment(options_.deploymentPath); });
    elsewhere = true;
  } else {
    std::string bytes;
    comm::runAgreed(*backend_, "planning", [&] {
      if (backend_->rank() != 0) return;
      bytes = core::encodeDeployment(firstPlan(examples, globalBatch, usage, &elsewhere));
    });
    if (backend_->worldSize() > 1) {
      bytes.push_back(elsewhere ? '1' : '0');
      backend_->broadcastBytes(bytes, 0, backend_->world());
      elsewhere = bytes.back() == '1';
      bytes.pop_back();
    }
    deployment = core::decodeDeployment(bytes, "deployment broadcast from rank 0");
  }
  // Note [Hosts of a deployment]: this job's hosts (every rank has them), whatever the source.
  deployment.rankHosts = hosts_;
  if (backend_->rank() == 0) logDeployment(deployment);
  if (!elsewhere && !options_.saveDeploymentPath.empty()) savePlanned(deployment);
  staging::DeploymentFit fit;
  fit.worldSize = backend_->worldSize();
  fit.usage = usage;
  fit.plannedElsewhere = elsewhere;
  fit.graphHash = model_->graph.hash();
  fit.globalBatch = globalBatch;
  fit.deviceMemory = job_.deviceMemory();
  fit.shardsOptimizer = options_.shardsOptimizer;
  std::optional<staging::VerifiedDeployment> verified;
  comm::runAgreed(*backend_, "validating the deployment", [&] {
    verified = staging::verifyDeployment(model_->graph, std::move(deployment), fit);
  });
  core::logger("DPStaging")->info("Routes verification passed.");
  return std::move(*verified);
}

core::Deployment Module::firstPlan(const std::vector<c10::IValue>& examples, int64_t globalBatch,
                                   core::PlanUsage usage, bool* elsewhere) {
  // 2. The planner (1, the deployment file, is read on every rank: obtainDeployment).
  core::logger("DPStaging")->info("Planning on rank 0 for {} (world size {}, batch size {}) ...",
                                  core::usageName(usage), backend_->worldSize(), globalBatch);
  PlanningInput input{*model_, examples, backend_->worldSize(), globalBatch,
                      job_.cluster(backend_->worldSize())};
  input.usage = usage;
  input.config = planConfig();
  return plan(input, elsewhere);
}

// Note [Saved deployments]: after obtainDeployment gave it this job's hosts.
void Module::savePlanned(const core::Deployment& deployment) {
  comm::runAgreed(*backend_, "saving the deployment", [&] {
    if (backend_->rank() != 0) return;
    core::saveDeployment(deployment, options_.saveDeploymentPath);
    core::logger("DPStaging")
        ->info("Saved the deployment to {} (save_deployment)", options_.saveDeploymentPath);
  });
}

bool plansWithoutZero(const core::Config& config, bool trainable, const std::string& problem) {
  const std::string setting = config.getString("zero");
  auto log = core::logger("Module");
  if (!trainable) {
    if (setting == "1")
      log->info("zero=1: the model has no trainable parameters, so there is nothing to shard; "
                "planning without ZeRO-1");
    return setting != "0";
  }
  if (problem.empty() || setting == "0") return false;
  AUTOSTAGE_CHECK_AS(UnsupportedError, setting != "1", problem);
  log->info("zero=auto plans without ZeRO-1: {}", problem.substr(0, problem.find(';')));
  return true;
}

// Note [Per-module plan options]
// Options are process-wide (core/config.h), but a few decisions belong to one module: zero=auto
// plans without ZeRO-1 for a module whose optimizer cannot be sharded (autostage/module.py's
// _choose_zero, or a C++ Module over a torch::optim optimizer), while another module of the same
// process may shard. ModuleOptions::planOptions holds such values; every plan of the module, its
// plan call (so its plan key) read the process-wide options with these over
// them, and the process-wide options stay as the user set them.
core::Config Module::planConfig() const {
  core::Config config = core::globalConfig();
  for (const auto& [key, value] : options_.planOptions)
    config.set(key, value, "this autostage.Module's own plan option");
  return config;
}

core::Deployment Module::plan(const PlanningInput& input, bool* fromStore) {
  bool kept = false;
  if (fromStore == nullptr) fromStore = &kept;
  *fromStore = false;
  if (options_.planner) return options_.planner(input);
  AUTOSTAGE_INTERNAL_ASSERT(autoPlanner_ != nullptr, "a module without a planner planned");
  return autoPlanner_->plan(input, fromStore);
}

// Note [Saved deployments]. The global batch of a dry run is what the later job on
// dryRunWorldSize ranks will feed: this rank's local batch times that many ranks, all on this
// node.
void Module::planDryRun(const std::vector<c10::IValue>& examples, int64_t globalBatch,
                        core::PlanUsage usage) {
  const int ranks = options_.dryRunWorldSize;
  const int64_t batch = globalBatch / backend_->worldSize() * ranks;
  core::logger("DPStaging")
      ->info(
          "Starting dry run of partitioning for {} ranks on {} rank(s) "
          "(batch size {}) ...",
          ranks, backend_->worldSize(), batch);
  PlanningInput input{*model_, examples, ranks, batch, job_.cluster(ranks, ranks)};
  input.usage = usage;
  input.config = planConfig();
  core::Deployment planned = plan(input);
  staging::DeploymentFit fit;
  fit.worldSize = ranks;
  fit.usage = usage;
  staging::verifyDeployment(model_->graph, planned, fit);
  logDeployment(planned);
  core::saveDeployment(planned, options_.saveDeploymentPath);
  core::logger("DPStaging")->info("Saved the deployment to {}", options_.saveDeploymentPath);
}

}  // namespace autostage::driver
