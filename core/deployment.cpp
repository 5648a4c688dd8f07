#include "core/deployment.h"

#include <algorithm>
#include <cstdlib>

namespace autostage::core {

bool StageDeployment::operator==(const StageDeployment& o) const {
  return id == o.id && name == o.name && nodes == o.nodes && ranks == o.ranks &&
         recompute == o.recompute && forwardSeconds == o.forwardSeconds &&
         backwardSeconds == o.backwardSeconds && allreduceSeconds == o.allreduceSeconds &&
         inputBytes == o.inputBytes && outputBytes == o.outputBytes && paramBytes == o.paramBytes &&
         activationBytes == o.activationBytes && optimizerBytes == o.optimizerBytes &&
         commBufferBytes == o.commBufferBytes && totalMemoryBytes == o.totalMemoryBytes &&
         sendForwardSeconds == o.sendForwardSeconds && sendBackwardSeconds == o.sendBackwardSeconds &&
         microBatchPerReplica == o.microBatchPerReplica && gradientBytes == o.gradientBytes &&
         workingBytes == o.workingBytes && zero == o.zero &&
         tensorParallel == o.tensorParallel;
}

bool Route::operator==(const Route& o) const {
  return value == o.value && producerStage == o.producerStage &&
         consumerStages == o.consumerStages && graphOutput == o.graphOutput &&
         carriesGradient == o.carriesGradient;
}

bool Deployment::operator==(const Deployment& o) const {
  return graphHash == o.graphHash && worldSize == o.worldSize && devicesPerNode == o.devicesPerNode && deviceMemory == o.deviceMemory &&
         batchSize == o.batchSize && microBatchCount == o.microBatchCount &&
         schedule == o.schedule && virtualStages == o.virtualStages && decomposer == o.decomposer && stages == o.stages &&
         routes == o.routes && options == o.options &&
         predictedIterationSeconds == o.predictedIterationSeconds && rankHosts == o.rankHosts;
}

double memoryMargin(const Deployment& d) {
  auto it = d.options.find("mem_margin");
  if (it == d.options.end()) return 0.1;
  char* end = nullptr;
  const double margin = std::strtod(it->second.c_str(), &end);
  return end && *end == 0 && margin >= 0 && margin < 1 ? margin : 0.1;
}

double usableMemory(const Deployment& d) {
  return static_cast<double>(d.deviceMemory) * (1 - memoryMargin(d));
}

std::string scheduleText(const Deployment& d) {
  if (d.virtualStages <= 1) return d.schedule;
  return d.schedule + "(v=" + std::to_string(d.virtualStages) + ")";
}

int pipelinePositions(const Deployment& d) {
  const int v = std::max(1, d.virtualStages);
  return static_cast<int>(d.stages.size()) / v;
}

std::vector<HostRanks> ranksByHost(const std::vector<std::string>& hosts,
                                   const std::vector<int>& ranks) {
  std::vector<HostRanks> byHost;
  for (size_t i = 0; i < (ranks.empty() ? hosts.size() : ranks.size()); ++i) {
    const int rank = ranks.empty() ? static_cast<int>(i) : ranks[i];
    const std::string& host = hosts.at(rank);
    auto found = std::find_if(byHost.begin(), byHost.end(),
                              [&](const HostRanks& entry) { return entry.host == host; });
    if (found == byHost.end()) found = byHost.insert(byHost.end(), {host, {}});
    found->ranks.push_back(rank);
  }
  return byHost;
}

std::string hostsText(const std::vector<std::string>& hosts, const std::vector<int>& ranks) {
  std::string text;
  for (const HostRanks& entry : ranksByHost(hosts, ranks)) {
    std::string list;
    for (int rank : entry.ranks) list += (list.empty() ? "" : ",") + std::to_string(rank);
    text += (text.empty() ? "" : ", ") + entry.host + " (ranks " + list + ")";
  }
  return text;
}

std::string stageHostsText(const Deployment& d) {
  if (d.rankHosts.empty()) return "";
  std::string text;
  for (const StageDeployment& stage : d.stages)
    text += (text.empty() ? "" : "; ") + stage.name + " on " + hostsText(d.rankHosts, stage.ranks);
  return text;
}

}  // namespace autostage::core
