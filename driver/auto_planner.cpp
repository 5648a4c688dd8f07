#include "driver/auto_planner.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "core/log.h"
#include "core/proto/deployment_file.h"
#include "core/proto/profile_file.h"
#include "decomposer/plan_option_fields.h"
#include "driver/split_models.h"
#include "profiler/comm_profile.h"
#include "service/plan_call.h"

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

}  // namespace

std::string planProfileKey(const profiler::ProfileKey& key, const core::Config& config,
                           const core::ClusterSpec& cluster) {
  const std::vector<std::string>& plannerKeys = decomposer::planOptionKeys();
  std::string text = key.text;
  for (const std::string& option : core::planInputOptions())
    if (std::find(plannerKeys.begin(), plannerKeys.end(), option) == plannerKeys.end())
      text += "\n" + option + "=" + config.text(option);
  if (config.getBool("measure_comm"))  // measured between these ranks and nodes
    text += "\ncomm measured over " + std::to_string(cluster.devices) + " ranks, " +
            std::to_string(cluster.devicesPerNode) + " per node";
  return text;
}

AutoPlanner::AutoPlanner(const std::shared_ptr<comm::Backend>& backend,
                         const Placement& placement)
    : comm_(core::globalConfig().getBool("measure_comm") ? measuredCommProfile(backend)
                                                          : profiler::configuredCommProfile()),
      placement_(placement) {}

AutoPlanner::~AutoPlanner() = default;

service::Planner& AutoPlanner::plannerFor(const core::Config& config) {
  std::string settings;
  for (const char* key : {"plan_cache_dir", "planner_address", "planner_timeout_s"})
    settings += config.text(key) + '\n';
  if (!planner_ || settings != plannerSettings_) {
    planner_ = service::makePlanner(config);
    plannerSettings_ = settings;
  }
  return *planner_;
}

core::Deployment AutoPlanner::plan(const PlanningInput& in, bool* fromStore) {
  const core::Config& config = in.config;  // Note [Per-module plan options] in plan_sources.cpp
  // Options first: a plan that cannot be made for this usage fails before profiling.
  decomposer::PlanOptions options = decomposer::PlanOptions::fromConfig(config);
  options.usage = in.usage;
  options.validate();  // e.g. schedule=1f1b cannot be planned for forward_backward
  const int64_t fixedRows = in.model.fixedBatchRows;  // Note [Fixed micro-batch size]
  if (fixedRows > 0) {
    AUTOSTAGE_CHECK_AS(ConfigError, options.microBatchSize == 0 || options.microBatchSize == fixedRows,
                       "option micro_batch_size=", options.microBatchSize, " asks for "
                       "micro-batches of that many rows, but torch.export fixed this model's "
                       "batch dimension to the ", fixedRows, " rows it was captured with, the only "
                       "row count its graph runs; set micro_batch_size=0 (or ", fixedRows, ")");
    options.microBatchSize = static_cast<int>(fixedRows);
  }
  const std::vector<int> virtualStages = options.virtualStageCandidates();
  const int perRank = *std::max_element(virtualStages.begin(), virtualStages.end());
  AUTOSTAGE_CHECK_AS(ConfigError, options.partitionNum <= int64_t(in.worldSize) * perRank,
                     "partition_num=", options.partitionNum, " asks for more pipeline stages "
                     "than this job's ", in.worldSize, " rank(s) can hold (", perRank,
                     " per rank with virtual_stages=", options.virtualStages, "); set "
                     "partition_num to at most ", in.worldSize * perRank, " (0 lets the planner "
                     "choose) or launch more ranks");
  service::Planner& planner = plannerFor(config);
  profiler::ProfilerOptions profilerOptions = profiler::ProfilerOptions::fromConfig();
  if (fixedRows > 0) profilerOptions.batchSizes = {fixedRows};  // all the graph runs
  // Note [Tensor-parallel profile]: the patterns' times on a member at the degrees it may use.
  profilerOptions.splitDegrees =
      splitProfileDegrees(in.model.graph, options, in.cluster.devicesPerNode, in.worldSize);
  const profiler::ProfileKey key =
      profiler::profileKey(in.model, in.exampleInputs, profilerOptions, in.cluster.deviceKind);
  proto::PlanCall call =
      service::makePlanCall(in.model.graph, nullptr, in.cluster, in.globalBatch, options);
  call.set_profile_key(planProfileKey(key, config, in.cluster));
  std::optional<proto::PlanAnswer> answer;
  if (profiledKey_ != key.text) {
    try {
      answer = planner.plan(call);  // with the profile the planner keeps of this model
    } catch (const service::NotStored&) {
      std::string where = planner.where();
      where[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(where[0])));
      core::logger("Module")->info("{} has no profile of this model yet: profiling here", where);
    }
    if (!answer) {
      core::logger("Module")->info("Running profiler ...");
      // Time and memory on the job's own device: CUDA events and the caching allocator's peak
      // for a CUDA job, so calibration and the load probe use that GPU.
      auto measurement = profiler::createMeasurementBackend(placement_.cudaIndex(),
                                                            placement_.device.kindText());
      ModelStateGuard keep(in.model.paramTensors);
      profile_ = profiler::profileGraph(in.model, in.exampleInputs, *measurement, profilerOptions,
                                        [&](int degree) { return memberModel(in.model, degree); });
      profiledKey_ = key.text;
    }
  } else {
    core::logger("Module")->info("Reusing this model's profile (planning for {})",
                                 core::usageName(in.usage));
  }
  if (!answer) {
    core::GraphProfile profile = profile_;
    profile.comm = comm_;
    call.set_profile(core::encodeProfile(profile));
    answer = planner.plan(call);
  }
  *fromStore = answer->from_store();
  return core::decodeDeployment(answer->deployment(), "the plan of " + planner.where());
}

}  // namespace autostage::driver
