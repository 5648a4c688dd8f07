#include "bindings/cli/plan_command.h"

#include <chrono>
#include <iomanip>
#include <sstream>

#include "bindings/cli/cli_args.h"
#include "bindings/cli/saved_files.h"
#include "core/config.h"
#include "core/error.h"
#include "decomposer/planner.h"
#include "decomposer/synthetic.h"

namespace autostage::cli {
namespace {

using decomposer::PlanOptions;

const std::vector<std::string> kValued = {
    "graph", "profile", "synthetic", "devices", "devices-per-node", "device-memory", "batch",
    "decomposer", "out", "max-blocks", "partition-num", "pipeline-num", "min-pipeline",
    "max-pipeline", "schedule", "usage", "mem-limit-gb", "mem-margin", "opt-param-factor",
    "intra-node-bandwidth", "inter-node-bandwidth", "latency", "peak-flops"};
const std::vector<std::string> kFlags = {"json", "help"};

PlanOptions planOptions(const Arguments& a) {
  PlanOptions o = PlanOptions::fromConfig(core::globalConfig());
  o.decomposer = a.get("decomposer", o.decomposer);
  o.maxBlocks = static_cast<int>(a.getInt("max-blocks", o.maxBlocks));
  o.partitionNum = static_cast<int>(a.getInt("partition-num", o.partitionNum));
  o.pipelineNum = static_cast<int>(a.getInt("pipeline-num", o.pipelineNum));
  o.minPipeline = static_cast<int>(a.getInt("min-pipeline", o.minPipeline));
  o.maxPipeline = static_cast<int>(a.getInt("max-pipeline", o.maxPipeline));
  o.schedule = a.get("schedule", o.schedule);
  o.usage = decomposer::parseUsage(a.get("usage", decomposer::usageName(o.usage)));
  o.memLimitGb = a.getFloat("mem-limit-gb", o.memLimitGb);
  o.memMargin = a.getFloat("mem-margin", o.memMargin);
  o.optParamFactor = a.getFloat("opt-param-factor", o.optParamFactor);
  o.validate();
  return o;
}

// Communication model from the config fallbacks (comm_bandwidth, allreduce_bandwidth,
// comm_latency), with per-level overrides from the command line.
core::CommProfile commProfile(const Arguments& a) {
  const core::Config& c = core::globalConfig();
  const double latency = a.getFloat("latency", c.getFloat("comm_latency"));
  const double p2p = c.getFloat("comm_bandwidth"), allreduce = c.getFloat("allreduce_bandwidth");
  core::CommProfile comm;
  comm.p2pIntraNode = {latency, a.getFloat("intra-node-bandwidth", p2p)};
  comm.p2pInterNode = {latency, a.getFloat("inter-node-bandwidth", p2p)};
  comm.allreduceIntraNode = {latency, a.getFloat("intra-node-bandwidth", allreduce)};
  comm.allreduceInterNode = {latency, a.getFloat("inter-node-bandwidth", allreduce)};
  return comm;
}

void writeJson(std::ostream& out, const core::Graph& graph, const decomposer::PlanResult& r) {
  out << std::setprecision(10) << "{\n"
      << "  \"plan_seconds\": " << r.planSeconds << ",\n"
      << "  \"nodes\": " << graph.nodeCount() << ",\n"
      << "  \"blocks\": " << r.blocking.blockCount() << ",\n"
      << "  \"stages\": " << r.plan.stages.size() << ",\n"
      << "  \"decomposer\": \"" << r.plan.decomposer << "\",\n"
      << "  \"micro_batches\": " << r.plan.microBatchCount << ",\n"
      << "  \"schedule\": \"" << decomposer::scheduleName(r.plan.schedule) << "\",\n"
      << "  \"usage\": \"" << decomposer::usageName(r.blocking.request.options.usage) << "\",\n"
      << "  \"predicted_iteration_ms\": " << r.evaluation.iterationSeconds * 1e3 << ",\n"
      << "  \"search_objective_ms\": " << r.evaluation.searchSeconds * 1e3 << ",\n"
      << "  \"simulated_iteration_ms\": " << r.simulation.iterationSeconds * 1e3 << ",\n"
      << "  \"bubble_fraction\": " << r.simulation.bubbleFraction << ",\n"
      << "  \"peak_memory_bytes\": " << static_cast<int64_t>(r.evaluation.peakMemoryBytes) << ",\n"
      << "  \"stage_list\": [";
  for (size_t s = 0; s < r.deployment.stages.size(); ++s) {
    const core::StageDeployment& st = r.deployment.stages[s];
    out << (s ? ", " : "") << "{\"name\": \"" << st.name << "\", \"replicas\": " << st.replicaCount()
        << ", \"first_rank\": " << st.ranks.front() << ", \"recompute\": " << (st.recompute ? "true" : "false")
        << ", \"memory_bytes\": " << st.totalMemoryBytes << "}";
  }
  out << "]\n}\n";
}

}  // namespace

std::string planUsage() {
  return "usage: autostage plan (--graph FILE [--profile FILE] | --synthetic SPEC)\n"
         "         --devices N --devices-per-node K --device-memory 40GiB --batch B\n"
         "         [--decomposer dp|data_parallel|uniform|param_balanced] [--out deployment.pb] [--json]\n"
         "         [--max-blocks N] [--partition-num N] [--pipeline-num N] [--min-pipeline N]\n"
         "         [--max-pipeline N] [--schedule gpipe|1f1b|auto] [--mem-limit-gb G] [--mem-margin F]\n"
         "         [--usage train_step|forward_backward|inference]  (the API that runs the plan;\n"
         "                    forward()/backward() run gpipe only; default train_step)\n"
         "         [--opt-param-factor F] [--intra-node-bandwidth B/s] [--inter-node-bandwidth B/s]\n"
         "         [--latency S] [--peak-flops F]\n"
         "  SPEC: bert:layers=96,hidden=2048,heads=32,seq=512 | gpt:... | resnet:blocks=16 | mlp:layers=8\n";
}

int runPlanCommand(const std::vector<std::string>& args, std::ostream& out) {
  Arguments a(args, kValued, kFlags);
  if (a.has("help")) {
    out << planUsage();
    return 0;
  }
  AUTOSTAGE_CHECK_AS(ConfigError, a.has("graph") != a.has("synthetic"),
                     "give exactly one of --graph FILE or --synthetic SPEC\n", planUsage());
  for (const char* required : {"devices", "device-memory", "batch"})
    AUTOSTAGE_CHECK_AS(ConfigError, a.has(required), "missing --", required, "\n", planUsage());
  PlanOptions options = planOptions(a);
  core::ClusterSpec cluster;
  cluster.devices = static_cast<int>(a.getInt("devices", 1));
  cluster.devicesPerNode = static_cast<int>(a.getInt("devices-per-node", cluster.devices));
  cluster.memoryPerDevice = parseMemorySize(a.get("device-memory"), "--device-memory");
  cluster.peakFlops = a.getFloat("peak-flops", 312e12);
  const int64_t batch = a.getInt("batch", 1);

  SavedModel model;
  if (a.has("synthetic")) {
    decomposer::DeviceModel device;
    device.peakFlops = cluster.peakFlops;
    decomposer::SyntheticModel synthetic = decomposer::syntheticFromSpec(a.get("synthetic"), device);
    model.graph = std::move(synthetic.graph);
    model.profile = std::move(synthetic.profile);
    model.profile.comm = commProfile(a);
  } else {
    model = loadSavedModel(a.get("graph"), a.get("profile"));
  }
  decomposer::PlanResult result = decomposer::planGraph(model.graph, model.profile, cluster, batch, options);
  if (a.has("json")) writeJson(out, model.graph, result);
  if (a.has("out")) saveDeploymentFile(result.deployment, a.get("out"));
  return 0;
}

}  // namespace autostage::cli
