#pragma once
// The planner's answer: which nodes form which stage, on which ranks, with how many micro-batches
// and which schedule, plus the routes of every value crossing a stage boundary. Produced by
// decomposer/, executed by staging/, serialised by core/proto (deployment_file.h). Plain data.
//
// Note [Routes]
// A route carries one BATCH/LOSS value from the stage that produces it (or from the batch feeder,
// producerStage == kFeederStage, for model inputs) to every other stage that reads it, and to the
// caller when it is a graph output. Gradients flow along the same route in reverse when the value
// is a floating-point tensor that depends on parameters. PARAM/CONST values never travel: every
// stage that needs a parameter holds it (tied parameters used by several stages have their
// gradients summed across those stages).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/ir/value.h"

namespace autostage::core {

constexpr int kFeederStage = -1;

struct StageDeployment {
  int id = 0;
  std::string name;            // RaNNC-style `STAGE_<firstBlock>_<lastBlock>`
  std::vector<NodeId> nodes;   // ascending node ids; a convex subset of the graph
  // Replica i runs on ranks[i * tensorParallel, (i + 1) * tensorParallel): one rank per replica
  // without tensor parallelism (Note [Tensor-parallel cost] in decomposer/cost_model.h).
  std::vector<int> ranks;
  bool recompute = false;      // keep only stage inputs in forward, recompute in backward
  // Predictions at the per-replica micro-batch size.
  double forwardSeconds = 0;
  double backwardSeconds = 0;
  double allreduceSeconds = 0;
  int64_t inputBytes = 0;
  int64_t outputBytes = 0;
  int64_t paramBytes = 0;
  int64_t activationBytes = 0;  // held by the schedule at its peak
  int64_t optimizerBytes = 0;
  int64_t commBufferBytes = 0;
  int64_t totalMemoryBytes = 0;  // per device
  // Added later (0 in files written before): per micro-batch transfer times to the next / the
  // previous stage, the per-replica micro-batch size, gradient and working bytes per device.
  double sendForwardSeconds = 0;
  double sendBackwardSeconds = 0;
  int64_t microBatchPerReplica = 0;
  int64_t gradientBytes = 0;
  int64_t workingBytes = 0;
  // ZeRO-1 (Note [ZeRO-1] in staging/gradient_sync.h): the optimizer state of the stage's
  // parameters is split over its replicas. False in files written before it was recorded.
  bool zero = false;
  // Ranks per replica, on one node, each holding 1/tensorParallel of the stage's shardable
  // operations. 1 in files written before it was recorded. This build's runtime runs 1 only
  // (staging::verifyDeployment refuses more); plans and `autostage show` carry any.
  int tensorParallel = 1;
  int replicaCount() const { return static_cast<int>(ranks.size()) / tensorParallel; }
  bool operator==(const StageDeployment& o) const;
};

struct Route {
  ValueId value = -1;
  int producerStage = kFeederStage;
  std::vector<int> consumerStages;  // ascending; empty when only the caller reads it
  bool graphOutput = false;         // returned to the caller
  bool carriesGradient = false;     // gradient flows back along this route
  bool operator==(const Route& o) const;
};

// Note [Hosts of a deployment]
// rankHosts records where a deployment runs, not what it was planned for: rankHosts[r] is rank r's
// hostname when the job spans several hosts. The driver fills it once per deployment, whatever
// the plan's source (planner, plan cache, deployment file), before it logs, saves or runs it
// (Note [Hosts in the log] in driver/module.cpp). It is empty for a one-host job, in a plan as the
// planner, the plan cache and the planning service hold it, and in files written before it was
// recorded: no plan cache key, service hash or fit check reads it, and a one-host deployment
// encodes to the same bytes as before. `autostage show` and `autostage report` name the hosts
// from it.

struct Deployment {
  std::string graphHash;
  int worldSize = 1;
  int devicesPerNode = 0;    // 0 in files written before it was recorded
  int64_t deviceMemory = 0;  // bytes per device planned for
  int64_t batchSize = 0;     // global batch
  int microBatchCount = 1;
  std::string schedule = "gpipe";  // "gpipe" or "1f1b"
  // Stages per pipeline position (Note [Pipeline schedules] in core/pipeline_schedule.h): with
  // v > 1, stage k runs on the ranks of stage k mod (stages / v), in Megatron's interleaved 1f1b
  // order. 1 in files written before it was recorded.
  int virtualStages = 1;
  std::string decomposer = "dp";
  std::vector<StageDeployment> stages;  // in pipeline order
  std::vector<Route> routes;
  std::map<std::string, std::string> options;  // effective planner options as text
  double predictedIterationSeconds = 0;
  // Empty, or one hostname per rank (Note [Hosts of a deployment]).
  std::vector<std::string> rankHosts;
  bool operator==(const Deployment& o) const;
};

// One host and the ranks on it.
struct HostRanks {
  std::string host;
  std::vector<int> ranks;
};

// The planner's memory margin recorded in the deployment options (0.1 when absent or bad) and the
// bytes usable per device it planned for: deviceMemory * (1 - margin).
double memoryMargin(const Deployment& deployment);
double usableMemory(const Deployment& deployment);
// Pipeline positions of a deployment: stages / virtualStages (Note [Pipeline schedules]).
int pipelinePositions(const Deployment& deployment);
// The schedule as users read it: "gpipe", "1f1b", or "1f1b(v=2)" with virtual stages.
std::string scheduleText(const Deployment& deployment);

// The hosts of `ranks` (every rank when empty) in order of first appearance, each with its ranks
// in the order given; hosts[r] is rank r's hostname (Note [Hosts of a deployment]), so every
// rank in `ranks` must index `hosts` (checkDeployment ensures it for a deployment's). Pure.
std::vector<HostRanks> ranksByHost(const std::vector<std::string>& hosts,
                                   const std::vector<int>& ranks = {});
// ranksByHost as the partition log's `Hosts:` line writes it: "a (ranks 0,1), b (ranks 2)".
std::string hostsText(const std::vector<std::string>& hosts, const std::vector<int>& ranks = {});
// Each stage's hosts, as the log's `Stages on hosts:` line writes them: "STAGE_0_3 on a (ranks
// 0,1); STAGE_4_7 on b (ranks 2,3)"; "" when the deployment records no hosts.
std::string stageHostsText(const Deployment& deployment);

}  // namespace autostage::core
