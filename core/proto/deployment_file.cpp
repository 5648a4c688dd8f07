#include "core/proto/deployment_file.h"

#include <map>
#include <vector>

#include "core/cluster_spec.h"
#include "core/error.h"
#include "core/proto/file_format.h"

namespace autostage::core {
namespace {

void stageToProto(const StageDeployment& stage, proto::StageDeployment* out) {
  out->set_id(stage.id);
  out->set_name(stage.name);
  out->mutable_nodes()->Add(stage.nodes.begin(), stage.nodes.end());
  out->mutable_ranks()->Add(stage.ranks.begin(), stage.ranks.end());
  out->set_recompute(stage.recompute);
  out->set_forward_seconds(stage.forwardSeconds);
  out->set_backward_seconds(stage.backwardSeconds);
  out->set_allreduce_seconds(stage.allreduceSeconds);
  out->set_input_bytes(stage.inputBytes);
  out->set_output_bytes(stage.outputBytes);
  out->set_param_bytes(stage.paramBytes);
  out->set_activation_bytes(stage.activationBytes);
  out->set_optimizer_bytes(stage.optimizerBytes);
  out->set_comm_buffer_bytes(stage.commBufferBytes);
  out->set_total_memory_bytes(stage.totalMemoryBytes);
  out->set_send_forward_seconds(stage.sendForwardSeconds);
  out->set_send_backward_seconds(stage.sendBackwardSeconds);
  out->set_micro_batch_per_replica(stage.microBatchPerReplica);
  out->set_gradient_bytes(stage.gradientBytes);
  out->set_working_bytes(stage.workingBytes);
  out->set_zero(stage.zero);
  if (stage.tensorParallel != 1) out->set_tensor_parallel(stage.tensorParallel);  // older bytes kept
}

StageDeployment stageFromProto(const proto::StageDeployment& message) {
  StageDeployment stage;
  stage.id = message.id();
  stage.name = message.name();
  stage.nodes.assign(message.nodes().begin(), message.nodes().end());
  stage.ranks.assign(message.ranks().begin(), message.ranks().end());
  stage.recompute = message.recompute();
  stage.forwardSeconds = message.forward_seconds();
  stage.backwardSeconds = message.backward_seconds();
  stage.allreduceSeconds = message.allreduce_seconds();
  stage.inputBytes = message.input_bytes();
  stage.outputBytes = message.output_bytes();
  stage.paramBytes = message.param_bytes();
  stage.activationBytes = message.activation_bytes();
  stage.optimizerBytes = message.optimizer_bytes();
  stage.commBufferBytes = message.comm_buffer_bytes();
  stage.totalMemoryBytes = message.total_memory_bytes();
  stage.sendForwardSeconds = message.send_forward_seconds();
  stage.sendBackwardSeconds = message.send_backward_seconds();
  stage.microBatchPerReplica = message.micro_batch_per_replica();
  stage.gradientBytes = message.gradient_bytes();
  stage.workingBytes = message.working_bytes();
  stage.zero = message.zero();
  stage.tensorParallel = message.tensor_parallel() == 0 ? 1 : message.tensor_parallel();
  return stage;
}

void routeToProto(const Route& route, proto::Route* out) {
  out->set_value(route.value);
  out->set_producer_stage(route.producerStage);
  out->mutable_consumer_stages()->Add(route.consumerStages.begin(), route.consumerStages.end());
  out->set_graph_output(route.graphOutput);
  out->set_carries_gradient(route.carriesGradient);
}

Route routeFromProto(const proto::Route& message) {
  Route route;
  route.value = message.value();
  route.producerStage = message.producer_stage();
  route.consumerStages.assign(message.consumer_stages().begin(), message.consumer_stages().end());
  route.graphOutput = message.graph_output();
  route.carriesGradient = message.carries_gradient();
  return route;
}

std::string serialize(const Deployment& deployment) {
  std::string payload;
  AUTOSTAGE_CHECK_AS(FormatError, toProto(deployment).SerializeToString(&payload),
                     "deployment of graph ", deployment.graphHash,
                     " cannot be serialized (over the 2 GiB protobuf limit)");
  return payload;
}

template <typename... Args>
[[noreturn]] void fail(const std::string& origin, Args&&... parts) {
  throw FormatError(origin + ": " + detail::concat(std::forward<Args>(parts)...) +
                    "; the deployment is inconsistent, re-plan to regenerate it");
}

// Note [Pipeline schedules] (core/pipeline_schedule.h): the first stages/v stages sit on
// disjoint rank sets; stage k >= stages/v runs on exactly the ranks of stage k mod (stages/v).
void checkStages(const Deployment& d, const std::string& origin) {
  if (d.virtualStages < 1 || d.stages.size() % d.virtualStages != 0)
    fail(origin, "virtual_stages is ", d.virtualStages, " for ", d.stages.size(),
         " stages, expected a divisor of the stage count");
  const size_t positions = d.stages.size() / d.virtualStages;
  std::map<int, int> stageOfRank;
  for (size_t i = 0; i < d.stages.size(); ++i) {
    const StageDeployment& s = d.stages[i];
    if (s.id != static_cast<int>(i))
      fail(origin, "stage entry ", i, " ('", s.name, "') has id ", s.id, ", expected ", i,
           " (stage ids are 0..n-1 in pipeline order)");
    if (s.ranks.empty()) fail(origin, "stage ", i, " ('", s.name, "') has no rank");
    if (s.tensorParallel < 1 || s.ranks.size() % s.tensorParallel != 0)
      fail(origin, "stage ", i, " ('", s.name, "') has tensor_parallel ", s.tensorParallel,
           " for ", s.ranks.size(), " ranks, expected a degree >= 1 dividing its rank count");
    for (size_t g = 0; d.devicesPerNode > 0 && g < s.ranks.size(); g += s.tensorParallel)
      for (size_t k = g + 1; k < g + s.tensorParallel; ++k)
        if (s.ranks[k] / d.devicesPerNode != s.ranks[g] / d.devicesPerNode)
          fail(origin, "stage ", i, " ('", s.name, "') has a tensor-parallel group of ranks ",
               s.ranks[g], "..", s.ranks[g + s.tensorParallel - 1], " across nodes of ",
               d.devicesPerNode, " devices, expected each group on one node");
    if (i >= positions && s.ranks != d.stages[i % positions].ranks)
      fail(origin, "stage ", i, " ('", s.name, "') is virtual stage ", i / positions,
           " of pipeline position ", i % positions, " but does not run on that position's ranks",
           " (virtual_stages=", d.virtualStages, ")");
    for (int rank : s.ranks) {
      if (rank < 0 || rank >= d.worldSize)
        fail(origin, "stage ", i, " ('", s.name, "') runs on rank ", rank,
             ", expected a rank in 0..", d.worldSize - 1, " (world_size=", d.worldSize, ")");
      if (i >= positions) continue;
      auto [it, fresh] = stageOfRank.emplace(rank, s.id);
      if (!fresh && it->second == s.id)
        fail(origin, "stage ", i, " ('", s.name, "') lists rank ", rank,
             " twice (a rank may hold only one stage replica)");
      if (!fresh)
        fail(origin, "rank ", rank, " holds a replica of stage ", it->second, " and of stage ",
             s.id, " (a rank holds one pipeline position; with virtual_stages=",
             d.virtualStages, " stage k runs on the ranks of stage k mod ", positions, ")");
    }
  }
}

void checkRoutes(const Deployment& d, const std::string& origin) {
  int stageCount = static_cast<int>(d.stages.size());
  for (size_t i = 0; i < d.routes.size(); ++i) {
    const Route& r = d.routes[i];
    if (r.producerStage != kFeederStage && (r.producerStage < 0 || r.producerStage >= stageCount))
      fail(origin, "route ", i, " (value ", r.value, ") comes from stage ", r.producerStage,
           ", expected the feeder (", kFeederStage, ") or a stage in 0..", stageCount - 1);
    for (int consumer : r.consumerStages)
      if (consumer < 0 || consumer >= stageCount)
        fail(origin, "route ", i, " (value ", r.value, ") goes to stage ", consumer,
             ", expected a stage in 0..", stageCount - 1);
  }
}

}  // namespace

proto::Deployment toProto(const Deployment& deployment) {
  proto::Deployment out;
  out.set_graph_hash(deployment.graphHash);
  out.set_world_size(deployment.worldSize);
  out.set_device_memory(deployment.deviceMemory);
  out.set_batch_size(deployment.batchSize);
  out.set_micro_batch_count(deployment.microBatchCount);
  out.set_schedule(deployment.schedule);
  out.set_decomposer(deployment.decomposer);
  for (const StageDeployment& stage : deployment.stages) stageToProto(stage, out.add_stages());
  for (const Route& route : deployment.routes) routeToProto(route, out.add_routes());
  for (const auto& [key, value] : deployment.options) {  // std::map: key order, deterministic
    proto::Option* option = out.add_options();
    option->set_key(key);
    option->set_value(value);
  }
  out.set_predicted_iteration_seconds(deployment.predictedIterationSeconds);
  out.set_devices_per_node(deployment.devicesPerNode);
  out.set_virtual_stages(deployment.virtualStages);
  out.mutable_rank_hosts()->Add(deployment.rankHosts.begin(), deployment.rankHosts.end());
  return out;
}

Deployment fromProto(const proto::Deployment& message, const std::string& origin) {
  Deployment d;
  d.graphHash = message.graph_hash();
  d.worldSize = message.world_size();
  d.deviceMemory = message.device_memory();
  d.batchSize = message.batch_size();
  d.microBatchCount = message.micro_batch_count();
  d.schedule = message.schedule();
  d.decomposer = message.decomposer();
  for (const auto& stage : message.stages()) d.stages.push_back(stageFromProto(stage));
  for (const auto& route : message.routes()) d.routes.push_back(routeFromProto(route));
  for (const auto& option : message.options())
    if (!d.options.emplace(option.key(), option.value()).second)
      fail(origin, "option '", option.key(), "' appears twice");
  d.predictedIterationSeconds = message.predicted_iteration_seconds();
  d.devicesPerNode = message.devices_per_node();
  d.virtualStages = message.virtual_stages() == 0 ? 1 : message.virtual_stages();
  d.rankHosts.assign(message.rank_hosts().begin(), message.rank_hosts().end());
  checkDeployment(d, origin);
  return d;
}

void checkDeployment(const Deployment& deployment, const std::string& origin) {
  if (deployment.worldSize < 1)
    fail(origin, "world_size is ", deployment.worldSize, ", expected at least 1");
  if (deployment.microBatchCount < 1)
    fail(origin, "micro_batch_count is ", deployment.microBatchCount, ", expected at least 1");
  if (!deployment.rankHosts.empty() &&
      deployment.rankHosts.size() != static_cast<size_t>(deployment.worldSize))
    fail(origin, "rank_hosts names ", deployment.rankHosts.size(), " hosts for world_size ",
         deployment.worldSize, ", expected none or one per rank");
  checkStages(deployment, origin);
  checkRoutes(deployment, origin);
}

std::string encodeDeployment(const Deployment& deployment) {
  return encodeFramed(kDeploymentFileKind, kDeploymentFormatVersion, serialize(deployment));
}

Deployment decodeDeployment(const std::string& bytes, const std::string& origin) {
  FramedPayload framed = decodeFramed(bytes, kDeploymentFileKind, kDeploymentFormatVersion, origin);
  return fromProto(parsePayload<proto::Deployment>(framed, origin), origin);
}

void saveDeployment(const Deployment& deployment, const std::string& path) {
  writeFramedFile(path, kDeploymentFileKind, kDeploymentFormatVersion, serialize(deployment));
}

Deployment loadDeployment(const std::string& path) {
  std::string origin = "'" + path + "'";
  FramedPayload framed = readFramedFile(path, kDeploymentFileKind, kDeploymentFormatVersion);
  return fromProto(parsePayload<proto::Deployment>(framed, origin), origin);
}

std::string describeMismatch(const Deployment& saved, const DeploymentKey& wanted) {
  std::vector<std::string> parts;
  auto compare = [&](const char* field, const std::string& was, const std::string& now) {
    if (was != now) parts.push_back(std::string(field) + "=" + was + ", this job has " + now);
  };
  auto withSize = [](int64_t bytes) {
    return std::to_string(bytes) + " (" + formatBytes(static_cast<double>(bytes)) + ")";
  };
  compare("graph_hash", saved.graphHash, wanted.graphHash);
  compare("world_size", std::to_string(saved.worldSize), std::to_string(wanted.worldSize));
  if (saved.deviceMemory != wanted.deviceMemory)
    compare("device_memory", withSize(saved.deviceMemory), withSize(wanted.deviceMemory));
  compare("batch_size", std::to_string(saved.batchSize), std::to_string(wanted.batchSize));
  if (parts.empty()) return "";
  std::string message = "deployment was planned for " + parts[0];
  for (size_t i = 1; i < parts.size(); ++i) message += "; " + parts[i];
  return message;
}

}  // namespace autostage::core
