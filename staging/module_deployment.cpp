// How a Module obtains and checks a deployment: from a saved file, a dry run, the plan cache or
// the planner on rank 0 (Note [Saved deployments], Note [Plan cache], Note [Plan usage]).
#include <algorithm>
#include <sstream>

#include "comm/agreement.h"
#include "core/error.h"
#include "core/log.h"
#include "core/proto/deployment_file.h"
#include "staging/module.h"
#include "staging/plan_cache.h"
#include "staging/route_check.h"

namespace autostage::staging {
namespace {

// Note [Plan usage]: a deployment (a loaded one may have been planned for another API) must run
// the schedule the call runs and budget what it holds.
void checkRunsAs(const core::Deployment& d, core::PlanUsage usage) {
  const std::string planned = core::recordedUsage(d);
  const std::string wanted = core::usageName(usage);
  const char* api = usage == core::PlanUsage::TrainStep ? "train_step" : "forward()";
  AUTOSTAGE_CHECK_AS(ConfigError,
                     usage == core::PlanUsage::TrainStep || d.schedule == "gpipe",
                     "the deployment runs schedule ", d.schedule, ", which forward() cannot run "
                     "(it runs every micro-batch's forward before any backward: gpipe); run it "
                     "with train_step(...) and a model returning its loss, use a deployment "
                     "planned for ", wanted, ", or plan again (drop load_deployment)");
  AUTOSTAGE_CHECK_AS(ConfigError,
                     usage == core::PlanUsage::Inference ||
                         planned != core::usageName(core::PlanUsage::Inference),
                     "the deployment was planned for inference (no gradients, no optimizer "
                     "state, no activations kept) but this call (", api, " with gradients) trains;"
                     " use a deployment planned for ", wanted, ", or plan again (drop "
                     "load_deployment)");
}

}  // namespace

void logDeployment(const core::Deployment& d) {
  auto log = core::logger("DPStaging");
  const std::string usage = core::recordedUsage(d);
  log->info("Deployment: {} stage(s), {} micro-batch(es), schedule {}, world size {}, for {}",
            d.stages.size(), d.microBatchCount, d.schedule, d.worldSize,
            usage.empty() ? "(usage not recorded)" : usage);
  for (const core::StageDeployment& s : d.stages) {
    std::ostringstream ranks;
    for (size_t i = 0; i < s.ranks.size(); ++i) ranks << (i ? "," : "") << s.ranks[i];
    log->info("{}: {} nodes, replicas={} ranks={{{}}} recompute={}", s.name, s.nodes.size(),
              s.replicaCount(), ranks.str(), s.recompute);
  }
}

core::Deployment Module::obtainDeployment(const std::vector<c10::IValue>& examples,
                                          int64_t globalBatch, core::PlanUsage usage) {
  core::Deployment deployment;
  // A saved deployment is for the first usage this module runs (Note [One deployment per usage]).
  if (!options_.deploymentPath.empty() && deploymentCount_ == 0) {
    core::logger("Module")->info("Loading deployment from {}", options_.deploymentPath);
    comm::runAgreed(*backend_, "loading the saved deployment",
                    [&] { deployment = core::loadDeployment(options_.deploymentPath); });
    return deployment;
  }
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
  std::string bytes;
  comm::runAgreed(*backend_, "planning", [&] {
    if (backend_->rank() != 0) return;
    const std::string cached = planCachePath(model_->graph.hash(), backend_->worldSize(),
                                             globalBatch, usage);
    if (!cached.empty() && readCachedPlan(cached, &bytes)) return;
    core::logger("DPStaging")->info("Planning on rank 0 for {} (world size {}, batch size {}) ...",
                                    core::usageName(usage), backend_->worldSize(), globalBatch);
    PlanningInput input{*model_, examples, backend_->worldSize(), globalBatch};
    input.usage = usage;
    core::Deployment planned = options_.planner(input);
    bytes = core::encodeDeployment(planned);
    if (!cached.empty()) writeCachedPlan(planned, cached);
    if (!options_.saveDeploymentPath.empty()) {
      core::saveDeployment(planned, options_.saveDeploymentPath);
      core::logger("DPStaging")->info("Saved the deployment to {} (save_deployment)",
                                      options_.saveDeploymentPath);
    }
  });
  if (backend_->worldSize() > 1) backend_->broadcastBytes(bytes, 0, backend_->world());
  return core::decodeDeployment(bytes, "deployment broadcast from rank 0");
}

// Note [Saved deployments]. The global batch of a dry run is what the later job on
// dryRunWorldSize ranks will feed: this rank's local batch times that many ranks.
void Module::planDryRun(const std::vector<c10::IValue>& examples, int64_t globalBatch,
                        core::PlanUsage usage) {
  const int ranks = options_.dryRunWorldSize;
  const int64_t batch = globalBatch / backend_->worldSize() * ranks;
  core::logger("DPStaging")->info("Starting dry run of partitioning for {} ranks on {} rank(s) "
                                  "(batch size {}) ...", ranks, backend_->worldSize(), batch);
  PlanningInput input{*model_, examples, ranks, batch};
  input.devicesPerNode = ranks;
  input.usage = usage;
  core::Deployment planned = options_.planner(input);
  verifyRoutes(model_->graph, planned);
  logDeployment(planned);
  core::saveDeployment(planned, options_.saveDeploymentPath);
  core::logger("DPStaging")->info("Saved the deployment to {}", options_.saveDeploymentPath);
}

// Note [Bad input on one rank]: checks that would otherwise fail inside the executor's
// collective construction, each naming the deployment field that does not fit this job
// (Note [Saved deployments]).
void Module::validateDeployment(const core::Deployment& deployment, int64_t globalBatch,
                                core::PlanUsage usage) const {
  AUTOSTAGE_CHECK_AS(ConfigError, deployment.worldSize == backend_->worldSize(),
                     "deployment field world_size is ", deployment.worldSize, " but this job has ",
                     backend_->worldSize(), " ranks; launch with ", deployment.worldSize,
                     " ranks, or plan again for this world size (drop load_deployment)");
  // A planner callback plans for this graph; a saved deployment may be for another one.
  bool loaded = !options_.deploymentPath.empty();
  AUTOSTAGE_CHECK_AS(ConfigError, !loaded || deployment.batchSize == globalBatch,
                     "deployment field batch_size is ", deployment.batchSize,
                     " but this job's global batch is ", globalBatch, " (", backend_->worldSize(),
                     " ranks x ", globalBatch / backend_->worldSize(), "); pass local batches of ",
                     deployment.batchSize / std::max(1, deployment.worldSize),
                     " samples, or plan again for this batch (drop load_deployment)");
  AUTOSTAGE_CHECK_AS(ConfigError, !loaded || options_.deviceMemory <= 0 ||
                         deployment.deviceMemory <= options_.deviceMemory,
                     "deployment field device_memory is ", deployment.deviceMemory,
                     " bytes but this job's devices have ", options_.deviceMemory,
                     " bytes (mem_limit_gb, or this node's memory shared by its ranks), so the "
                     "plan might not fit; set mem_limit_gb to at least ",
                     static_cast<double>(deployment.deviceMemory) / (1 << 30),
                     " if the devices really have that much, or plan again (drop load_deployment)");
  AUTOSTAGE_CHECK_AS(FormatError, !loaded || deployment.graphHash == model_->graph.hash(),
                     "deployment field graph_hash is ", deployment.graphHash,
                     " but the traced model's graph hash is ", model_->graph.hash(),
                     "; the deployment was planned for a different model or input shape: load "
                     "the deployment saved for this model, or plan again (drop load_deployment)");
  checkRunsAs(deployment, usage);
  verifyRoutes(model_->graph, deployment);
}

}  // namespace autostage::staging
