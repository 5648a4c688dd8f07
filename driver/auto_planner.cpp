#include "driver/auto_planner.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "core/log.h"
#include "core/proto/deployment_file.h"
#include "decomposer/planner.h"
#include "profiler/comm_profile.h"
#include "profiler/profiler.h"
#include "service/plan_call.h"
#include "service/planner_client.h"
#include "staging/call_inputs.h"

namespace autostage::driver {
namespace {

// Note [Profiling leaves the model untouched]
// Profiling runs the model's own parameter and buffer tensors forward and backward: BatchNorm
// running statistics and num_batches_tracked would advance and gradients would be left behind
// (and then broadcast from rank 0 to every replica). The guard restores values and gradients.
class ModelStateGuard {
 public:
  explicit ModelStateGuard(const std::vector<at::Tensor>& tensors) : tensors_(tensors) {
    at::NoGradGuard noGrad;
    for (const at::Tensor& t : tensors_) {
      values_.push_back(t.clone());
      grads_.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
    }
  }
  ~ModelStateGuard() {
    at::NoGradGuard noGrad;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      tensors_[i].detach().copy_(values_[i]);
      if (tensors_[i].requires_grad()) tensors_[i].mutable_grad() = grads_[i];
    }
  }

 private:
  std::vector<at::Tensor> tensors_, values_, grads_;
};

core::CommProfile measuredCommProfile(const std::shared_ptr<comm::Backend>& backend) {
  static std::mutex mutex;
  static std::map<const comm::Backend*, core::CommProfile> measured;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = measured.find(backend.get());
  if (found != measured.end()) return found->second;
  core::CommProfile comm = profiler::profileComm(backend.get());
  measured.emplace(backend.get(), comm);
  return comm;
}

// Replays a partition log line the service captured ("[DPStaging] [info] ...") through the
// named logger, so a job asking the service logs what a local plan would have, at the job's
// log levels.
void replayLogLine(const std::string& line) {
  size_t nameEnd = line.find("] [");
  size_t levelEnd = nameEnd == std::string::npos ? nameEnd : line.find("] ", nameEnd + 3);
  if (line.empty() || line[0] != '[' || levelEnd == std::string::npos) {
    core::logger("Service")->info("{}", line);
    return;
  }
  auto level = spdlog::level::from_str(line.substr(nameEnd + 3, levelEnd - nameEnd - 3));
  core::logger(line.substr(1, nameEnd - 1))->log(level, "{}", line.substr(levelEnd + 2));
}

// Note [Planning service]: rank 0 asks the service at planner_address for the plan: first with
// the profile key only (a service that has this model's profile plans with it, and the job skips
// profiling), then, after profiling here, with the profile. Empty when the service did not
// answer (not running, timeout, or an error on its side, logged) or, for the first ask, has no
// profile: the job then profiles and/or plans locally. A PlanError (nothing fits) is the answer
// and is thrown.
std::optional<core::Deployment> askPlanningService(const PlanningInput& in,
                                                   const core::GraphProfile* profile,
                                                   const std::string& profileKey,
                                                   const decomposer::PlanOptions& options,
                                                   const core::Config& config, bool* failed) {
  const std::string address = config.getString("planner_address");
  if (address.empty()) return std::nullopt;
  auto log = core::logger("Module");
  log->info("Asking the planning service at {} {}...", address,
            profile ? "" : "(for this model's stored profile) ");
  try {
    service::PlannerClient client(address);
    proto::PlanCall call =
        service::makePlanCall(in.model.graph, profile, in.cluster, in.globalBatch, options);
    call.set_profile_key(profileKey);
    proto::PlanAnswer answer = client.plan(call, config.getFloat("planner_timeout_s"));
    for (const std::string& line : answer.log()) replayLogLine(line);
    log->info("Plan {} from the planning service at {} ({})", answer.plan_key(), address,
              answer.from_store() ? "from its store" : "planned for this job");
    return core::decodeDeployment(answer.deployment(), "the planning service's answer");
  } catch (const PlanError&) {
    throw;
  } catch (const service::NotStored&) {
    log->info("The planning service has no profile of this model yet: profiling here");
    return std::nullopt;
  } catch (const Error& e) {
    log->warn("{}; planning locally", e.what());
    *failed = true;
    return std::nullopt;
  }
}

}  // namespace

void checkProfiledFeasibility(const core::Graph& graph, const core::GraphProfile& profile,
                              const core::Deployment& deployment) {
  for (const core::StageDeployment& stage : deployment.stages) {
    int64_t shares = int64_t{deployment.microBatchCount} * std::max(1, stage.replicaCount());
    int64_t micro = (deployment.batchSize + shares - 1) / shares;
    for (core::NodeId n : stage.nodes) {
      const core::NodeProfile& p = profile.nodes.at(n);
      if (p.failure.empty() || (p.maxBatch >= 0 && micro <= p.maxBatch)) continue;
      AUTOSTAGE_CHECK_AS(PlanError, false, "stage ", stage.name, " would run ",
                         profiler::nodeLabel(graph, n), " at micro-batch size ", micro,
                         ", but profiling it failed: ", p.failure, "; largest batch it ran at: ",
                         p.maxBatch, ". Use a smaller batch, more micro-batches or more ranks");
    }
  }
}

AutoPlanner::AutoPlanner(const std::shared_ptr<comm::Backend>& backend,
                         const Placement& placement)
    : comm_(core::globalConfig().getBool("measure_comm") ? measuredCommProfile(backend)
                                                          : profiler::configuredCommProfile()),
      placement_(placement) {}

core::Deployment AutoPlanner::plan(const PlanningInput& in) {
  const core::Config& config = in.config;  // Note [Per-module plan options] in plan_sources.cpp
  // Options first: a plan that cannot be made for this usage fails before profiling.
  decomposer::PlanOptions options = decomposer::PlanOptions::fromConfig(config);
  options.usage = in.usage;
  options.validate();  // e.g. schedule=1f1b cannot be planned for forward_backward
  const std::vector<int> virtualStages = options.virtualStageCandidates();
  const int perRank = *std::max_element(virtualStages.begin(), virtualStages.end());
  AUTOSTAGE_CHECK_AS(ConfigError, options.partitionNum <= int64_t(in.worldSize) * perRank,
                     "partition_num=", options.partitionNum, " asks for more pipeline stages "
                     "than this job's ", in.worldSize, " rank(s) can hold (", perRank,
                     " per rank with virtual_stages=", options.virtualStages, "); set "
                     "partition_num to at most ", in.worldSize * perRank, " (0 lets the planner "
                     "choose) or launch more ranks");
  // The graph hash covers the shapes but the batch (dim 0), which the profile depends on too.
  const std::string key =
      in.model.graph.hash() + staging::signatureOf(staging::tensorsOf(in.exampleInputs), false);
  const profiler::ProfilerOptions profilerOptions = profiler::ProfilerOptions::fromConfig();
  // What the profile measures, for the planning service (Note [Planning service]).
  const std::string profileKey =
      key + "\n" + profilerOptions.toString() + "\n" + in.cluster.deviceKind;
  bool serviceFailed = false;  // asked once without an answer: do not wait for it again
  if (profiledKey_ != key) {
    if (auto planned =
            askPlanningService(in, nullptr, profileKey, options, config, &serviceFailed))
      return *planned;  // planned with the profile the service keeps of this model
    core::logger("Module")->info("Running profiler ...");
    // Time and memory on the job's own device: CUDA events and the caching allocator's peak for
    // a CUDA job, so calibration and the load probe use that GPU, and its profile is keyed by
    // the GPU's model (MeasurementBackend::deviceKind).
    auto measurement =
        profiler::createMeasurementBackend(placement_.cudaIndex());
    ModelStateGuard keep(in.model.paramTensors);
    profile_ = profiler::profileGraph(in.model, in.exampleInputs, *measurement, profilerOptions);
    profiledKey_ = key;
  } else {
    core::logger("Module")->info("Reusing this model's profile (planning for {})",
                                 core::usageName(in.usage));
  }
  core::GraphProfile profile = profile_;
  profile.comm = comm_;
  std::optional<core::Deployment> fromService =
      serviceFailed ? std::nullopt
                    : askPlanningService(in, &profile, profileKey, options, config,
                                         &serviceFailed);
  core::Deployment deployment =
      fromService ? std::move(*fromService)
                  : decomposer::planGraph(in.model.graph, profile, in.cluster, in.globalBatch,
                                          options)
                        .deployment;
  // The decomposer does not read NodeProfile::failure yet: refuse such plans here, whichever
  // planned them.
  checkProfiledFeasibility(in.model.graph, profile, deployment);
  return deployment;
}

}  // namespace autostage::driver
