#include "bindings/cpp/auto_planner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include <map>
#include <mutex>
#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "comm/registry.h"
#include "core/error.h"
#include "core/log.h"
#include "core/proto/deployment_file.h"
#include "decomposer/planner.h"
#include "profiler/comm_profile.h"
#include "profiler/profiler.h"
#include "service/plan_call.h"
#include "service/planner_client.h"
#include "staging/call_inputs.h"

namespace autostage {
namespace {

// Ranks sharing this node, as OpenMPI reports it (1 outside mpirun).
int localRankCount(int worldSize) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  int count = local ? std::atoi(local) : 1;
  return std::clamp(count, 1, std::max(worldSize, 1));
}

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
std::optional<core::Deployment> askPlanningService(const staging::PlanningInput& in,
                                                   const core::GraphProfile* profile,
                                                   const std::string& profileKey,
                                                   const core::ClusterSpec& cluster,
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
        service::makePlanCall(in.model.graph, profile, cluster, in.globalBatch, options);
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

core::ClusterSpec localCluster(int worldSize, int devicesPerNode, const core::Config& config) {
  core::ClusterSpec spec;
  spec.deviceKind = "cpu";
  spec.devices = worldSize;
  spec.devicesPerNode = devicesPerNode;
  int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  spec.memoryPerDevice = physical / devicesPerNode;
  spec.intraNodeBandwidth = config.getFloat("comm_bandwidth");
  spec.interNodeBandwidth = config.getFloat("comm_bandwidth");
  spec.latencySeconds = config.getFloat("comm_latency");
  spec.validate();
  return spec;
}

int64_t jobDeviceMemory(const core::Config& config) {
  const double limitGb = config.getFloat("mem_limit_gb");
  if (limitGb > 0) return static_cast<int64_t>(core::gibToBytes(limitGb));
  const int ranksHere = localRankCount(1 << 20);  // this node's ranks, whatever the world size
  return localCluster(ranksHere, ranksHere, config).memoryPerDevice;
}

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

staging::PlanningCallback autoPlanner(std::shared_ptr<comm::Backend> backend) {
  if (!backend) {
    comm::registerBuiltinBackends();
    backend = comm::sharedBackend("mpi");
  }
  // Every rank measures (collective) once per process and backend: the links do not change
  // between modules, and a job building several modules would otherwise pay seconds each time.
  // Rank 0 keeps the result for planning. With measure_comm=false (deterministic plans, e.g.
  // in tests, or a busy machine whose timings would mislead) the configured costs are used.
  core::CommProfile comm = core::globalConfig().getBool("measure_comm")
                               ? measuredCommProfile(backend)
                               : profiler::configuredCommProfile();
  // Note [One deployment per usage]: a module plans once per usage for the same imported model;
  // the profile of the last (graph, example shapes) is kept so that only planning runs again.
  auto lastProfile = std::make_shared<std::pair<std::string, core::GraphProfile>>();
  return [comm, lastProfile](const staging::PlanningInput& in) {
    const core::Config& config = core::globalConfig();
    int64_t forcedStages = config.getInt("partition_num");
    AUTOSTAGE_CHECK_AS(ConfigError, forcedStages <= in.worldSize, "partition_num=", forcedStages,
                       " asks for more pipeline stages than this job's ", in.worldSize,
                       " rank(s), and every stage needs a rank of its own; set partition_num to "
                       "at most ", in.worldSize, " (0 lets the planner choose) or launch more ranks");
    // Options first: a plan that cannot be made for this usage fails before profiling.
    decomposer::PlanOptions options = decomposer::PlanOptions::fromConfig(config);
    options.usage = in.usage;
    options.validate();  // e.g. schedule=1f1b cannot be planned for forward_backward
    // The graph hash covers the shapes but the batch (dim 0), which the profile depends on too.
    const std::string key =
        in.model.graph.hash() + staging::signatureOf(staging::tensorsOf(in.exampleInputs), false);
    const profiler::ProfilerOptions profilerOptions = profiler::ProfilerOptions::fromConfig();
    const int perNode = in.devicesPerNode > 0 ? in.devicesPerNode : localRankCount(in.worldSize);
    core::ClusterSpec cluster = localCluster(in.worldSize, perNode, config);
    // What the profile measures, for the planning service (Note [Planning service]).
    const std::string profileKey =
        key + "\n" + profilerOptions.toString() + "\n" + cluster.deviceKind;
    bool serviceFailed = false;  // asked once without an answer: do not wait for it again
    if (lastProfile->first != key) {
      if (auto planned = askPlanningService(in, nullptr, profileKey, cluster, options, config,
                                            &serviceFailed))
        return *planned;  // planned with the profile the service keeps of this model
      core::logger("Module")->info("Running profiler ...");
      auto measurement = profiler::createCpuMeasurementBackend();
      ModelStateGuard keep(in.model.paramTensors);
      lastProfile->second = profiler::profileGraph(in.model, in.exampleInputs, *measurement,
                                                   profilerOptions);
      lastProfile->first = key;
    } else {
      core::logger("Module")->info("Reusing this model's profile (planning for {})",
                                   core::usageName(in.usage));
    }
    core::GraphProfile profile = lastProfile->second;
    profile.comm = comm;
    std::optional<core::Deployment> fromService =
        serviceFailed ? std::nullopt
                      : askPlanningService(in, &profile, profileKey, cluster, options, config,
                                           &serviceFailed);
    core::Deployment deployment =
        fromService ? std::move(*fromService)
                    : decomposer::planGraph(in.model.graph, profile, cluster, in.globalBatch,
                                            options)
                          .deployment;
    // The decomposer does not read NodeProfile::failure yet: refuse such plans here.
    checkProfiledFeasibility(in.model.graph, profile, deployment);
    return deployment;
  };
}

}  // namespace autostage
