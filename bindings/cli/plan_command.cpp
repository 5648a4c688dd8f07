#include "bindings/cli/plan_command.h"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "bindings/cli/cli_args.h"
#include "bindings/cli/deployment_view.h"
#include "bindings/cli/saved_files.h"
#include "core/comm_costs.h"
#include "core/config.h"
#include "core/error.h"
#include "core/proto/deployment_file.h"
#include "decomposer/device_presets.h"
#include "decomposer/plan_option_fields.h"
#include "decomposer/planner.h"
#include "decomposer/synthetic.h"
#include "service/plan_call.h"
#include "service/planner.h"
#include "service/planner_client.h"
#include "service/planning_core.h"

namespace autostage::cli {
namespace {

using decomposer::PlanOptions;

// A planner option's flag: its config key with dashes (Note [Plan option fields]).
std::string flagOf(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

// The command's own valued flags, and every planner option's.
std::vector<std::string> withPlannerFlags(std::vector<std::string> flags) {
  for (const std::string& key : decomposer::planOptionKeys()) flags.push_back(flagOf(key));
  return flags;
}

const std::vector<std::string> kValued = withPlannerFlags(
    {"graph", "profile", "synthetic", "devices", "devices-per-node", "device-memory", "batch",
     "out", "usage", "device-preset", "intra-node-bandwidth", "inter-node-bandwidth", "latency",
     "peak-flops", "server", "timeout-s"});
const std::vector<std::string> kFlags = {"json", "help", "csv"};

// The config's planner options, each overridden by its flag when given.
PlanOptions planOptions(const Arguments& a) {
  PlanOptions o = PlanOptions::fromConfig(core::globalConfig());
  for (const std::string& key : decomposer::planOptionKeys())
    if (a.has(flagOf(key))) decomposer::setPlanOption(o, key, a.get(flagOf(key)));
  o.usage = decomposer::parseUsage(a.get("usage", decomposer::usageName(o.usage)));
  o.validate();
  return o;
}

// Note [Device presets]: --device-preset NAME sets the device's memory, peak FLOP/s for the
// precision, HBM and links; every explicit flag overrides the preset's figure.
std::optional<decomposer::DevicePreset> presetOf(const Arguments& a) {
  if (!a.has("device-preset")) return std::nullopt;
  return decomposer::devicePreset(a.get("device-preset"));
}

// The cluster flags common to plan and whatif, for `devices` devices (whatif lists several; the
// memory is set by the caller).
core::ClusterSpec commandCluster(const Arguments& a, const PlanOptions& options, int devices) {
  const auto preset = presetOf(a);
  core::ClusterSpec cluster;
  cluster.devices = devices;
  cluster.devicesPerNode = static_cast<int>(
      a.getInt("devices-per-node", preset ? preset->devicesPerServer : cluster.devices));
  cluster.peakFlops =
      a.getFloat("peak-flops", preset ? preset->peakFlops(options.precision) : 312e12);
  if (preset) cluster.deviceKind = preset->model;
  return cluster;
}

// --device-memory, or the preset's memory.
std::string memoryArgument(const Arguments& a, const std::string& usage) {
  if (a.has("device-memory")) return a.get("device-memory");
  const auto preset = presetOf(a);
  AUTOSTAGE_CHECK_AS(ConfigError, preset.has_value(),
                     "missing --device-memory (or --device-preset)\n", usage);
  return std::to_string(static_cast<int64_t>(preset->memoryBytes));
}

// Communication model from the config fallbacks (comm_bandwidth, allreduce_bandwidth,
// comm_latency), with per-level overrides from the command line.
core::CommProfile commProfile(const Arguments& a) {
  const auto preset = presetOf(a);
  core::CommProfile comm =
      preset ? preset->comm() : core::configuredCommProfile(core::globalConfig());
  const double intraLatency = a.getFloat("latency", comm.p2pIntraNode.latencySeconds);
  const double interLatency = a.getFloat("latency", comm.p2pInterNode.latencySeconds);
  comm.p2pIntraNode = {intraLatency,
                       a.getFloat("intra-node-bandwidth", comm.p2pIntraNode.bytesPerSecond)};
  comm.p2pInterNode = {interLatency,
                       a.getFloat("inter-node-bandwidth", comm.p2pInterNode.bytesPerSecond)};
  comm.allreduceIntraNode = {intraLatency, a.getFloat("intra-node-bandwidth",
                                                      comm.allreduceIntraNode.bytesPerSecond)};
  comm.allreduceInterNode = {interLatency, a.getFloat("inter-node-bandwidth",
                                                      comm.allreduceInterNode.bytesPerSecond)};
  return comm;
}

// Note [Plan JSON]
// `autostage plan --json` writes one shape whoever planned (this process's planner or the
// service's: Note [One planner] in service/planner.h), from the plan answer: the deployment's
// summary (simulated figures from its stage times), the prediction, the graph's size and what
// each phase of the planner took when the plan was made, whether the answer came from a store,
// and its plan key.
void writePlanJson(std::ostream& out, const proto::PlanAnswer& a, const PlanOptions& options) {
  const core::Deployment d = core::decodeDeployment(a.deployment(), "the plan answer");
  const decomposer::SimulationResult sim = simulateDeployment(d);
  out << std::setprecision(10) << "{\n"
      << "  \"plan_seconds\": " << a.plan_seconds() << ",\n"
      << "  \"stages\": " << d.stages.size() << ",\n"
      << "  \"decomposer\": \"" << d.decomposer << "\",\n"
      << "  \"micro_batches\": " << d.microBatchCount << ",\n"
      << "  \"schedule\": \"" << d.schedule << "\",\n"
      << "  \"virtual_stages\": " << d.virtualStages << ",\n"
      << "  \"usage\": \"" << decomposer::usageName(options.usage) << "\",\n"
      << "  \"replicas\": \"" << service::replicasOf(d) << "\",\n"
      << "  \"tensor_parallel\": \"" << service::tensorParallelOf(d) << "\",\n"
      << "  \"predicted_iteration_ms\": " << a.iteration_seconds() * 1e3 << ",\n"
      << "  \"simulated_iteration_ms\": " << sim.iterationSeconds * 1e3 << ",\n"
      << "  \"bubble_fraction\": " << sim.bubbleFraction << ",\n"
      << "  \"peak_memory_bytes\": " << a.peak_bytes() << ",\n"
      << "  \"nodes\": " << a.graph_nodes() << ",\n"
      << "  \"blocks\": " << a.blocks() << ",\n"
      << "  \"search_objective_ms\": " << a.search_objective_seconds() * 1e3 << ",\n"
      << "  \"phase_seconds\": [";
  for (int i = 0; i < a.phases_size(); ++i)
    out << (i ? ", " : "") << "{\"phase\": \"" << a.phases(i).name()
        << "\", \"seconds\": " << a.phases(i).seconds() << "}";
  out << "],\n"
      << "  \"from_store\": " << (a.from_store() ? "true" : "false") << ",\n"
      << "  \"plan_key\": \"" << a.plan_key() << "\",\n"
      << "  \"stage_list\": [";
  for (size_t s = 0; s < d.stages.size(); ++s) {
    const core::StageDeployment& st = d.stages[s];
    out << (s ? ", " : "") << "{\"name\": \"" << st.name << "\", \"replicas\": " << st.replicaCount()
        << ", \"tensor_parallel\": " << st.tensorParallel
        << ", \"first_rank\": " << st.ranks.front() << ", \"recompute\": " << (st.recompute ? "true" : "false")
        << ", \"zero\": " << (st.zero ? 1 : 0)
        << ", \"memory_bytes\": " << st.totalMemoryBytes << "}";
  }
  out << "]\n}\n";
}

// The model a plan or what-if command names: a saved graph (+ profile) or a synthetic spec.
SavedModel commandModel(const Arguments& a, double peakFlops, const PlanOptions& options) {
  AUTOSTAGE_CHECK_AS(ConfigError, a.has("graph") != a.has("synthetic"),
                     "give exactly one of --graph FILE or --synthetic SPEC");
  if (!a.has("synthetic")) return loadSavedModel(a.get("graph"), a.get("profile"));
  SavedModel model;
  const auto preset = presetOf(a);
  decomposer::DeviceModel device =
      preset ? preset->deviceModel(options.precision) : decomposer::DeviceModel{};
  device.peakFlops = peakFlops;
  decomposer::SyntheticModel synthetic = decomposer::syntheticFromSpec(a.get("synthetic"), device);
  model.graph = std::move(synthetic.graph);
  model.profile = std::move(synthetic.profile);
  model.profile.comm = commProfile(a);
  return model;
}

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> items;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) items.push_back(item);
  return items;
}

}  // namespace

std::string planUsage() {
  return "usage: autostage plan (--graph FILE [--profile FILE] | --synthetic SPEC)\n"
         "         --devices N --devices-per-node K --device-memory 40GiB --batch B\n"
         "         (--devices-per-node and --device-memory may be left to --device-preset)\n"
         "         [--decomposer dp|data_parallel|uniform|param_balanced] [--out deployment.pb] [--json]\n"
         "         [--max-blocks N] [--partition-num N] [--pipeline-num N] [--min-pipeline N]\n"
         "         [--micro-batch-size N]  (rows per micro-batch and replica; 0: planner chooses)\n"
         "         [--max-pipeline N] [--schedule gpipe|1f1b|auto] [--virtual-stages auto|1|2|4]\n"
         "         [--mem-limit-gb G] [--mem-margin F]\n"
         "         [--usage train_step|forward_backward|inference]  (the API that runs the plan;\n"
         "                    forward()/backward() run gpipe only; default train_step)\n"
         "         [--opt-param-factor F] [--intra-node-bandwidth B/s] [--inter-node-bandwidth B/s]\n"
         "         [--latency S] [--peak-flops F] [--recompute auto|always|never] [--zero auto|0|1]\n"
         "         [--precision fp32|bf16|fp16] [--tensor-parallel 1|auto|2|4|8]\n"
         "         [--device-preset a100-40gb|a100-80gb|h100-80gb|h200]  (memory, peak FLOP/s,\n"
         "                    HBM and links from the data sheet; flags above override them)\n"
         "         [--server unix:PATH|tcp:HOST:PORT [--timeout-s S]]  (ask `autostage serve`)\n"
         "  SPEC: bert:layers=96,hidden=2048,heads=32,seq=512[,kv_heads=8] | gpt:... | resnet:blocks=16\n"
         "        | mlp:layers=8\n";
}

int runPlanCommand(const std::vector<std::string>& args, std::ostream& out) {
  Arguments a(args, kValued, kFlags);
  if (a.has("help")) {
    out << planUsage();
    return 0;
  }
  AUTOSTAGE_CHECK_AS(ConfigError, a.has("graph") != a.has("synthetic"),
                     "give exactly one of --graph FILE or --synthetic SPEC\n", planUsage());
  for (const char* required : {"devices", "batch"})
    AUTOSTAGE_CHECK_AS(ConfigError, a.has(required), "missing --", required, "\n", planUsage());
  PlanOptions options = planOptions(a);
  core::ClusterSpec cluster =
      commandCluster(a, options, static_cast<int>(a.getInt("devices", 1)));
  cluster.memoryPerDevice = parseMemorySize(memoryArgument(a, planUsage()), "--device-memory");
  const int64_t batch = a.getInt("batch", 1);

  SavedModel model = commandModel(a, cluster.peakFlops, options);
  // Note [One planner]: the service when --server names one, else this process's planner.
  std::unique_ptr<service::Planner> planner =
      a.has("server") ? service::makeRemotePlanner(a.get("server"), a.getFloat("timeout-s", 600))
                      : service::makeLocalPlanner("");
  const proto::PlanAnswer answer =
      planner->plan(service::makePlanCall(model.graph, model.profile, cluster, batch, options));
  if (a.has("json")) writePlanJson(out, answer, options);
  if (a.has("out"))
    saveDeploymentFile(core::decodeDeployment(answer.deployment(), "the plan answer"),
                       a.get("out"));
  return 0;
}

}  // namespace autostage::cli

namespace autostage::cli {
namespace {

const std::vector<std::string> kWhatIfValued = withPlannerFlags(
    {"graph", "profile", "synthetic", "devices", "devices-per-node", "device-memory", "batch",
     "usage", "device-preset", "intra-node-bandwidth", "inter-node-bandwidth", "latency",
     "peak-flops", "server", "timeout-s"});

// An error message inside a CSV or JSON string: one line, quotes escaped (`""` in CSV).
std::string escaped(const std::string& text, bool csv) {
  std::string out;
  for (char c : text) {
    if (c == '\n') out += ' ';
    else if (c == '"') out += csv ? "\"\"" : "\\\"";
    else if (c == '\\' && !csv) out += "\\\\";
    else out += c;
  }
  return out;
}

void writeWhatIf(std::ostream& out, const proto::WhatIfAnswer& answer, bool csv, bool json) {
  if (json) {
    out << std::setprecision(10) << "[";
    for (int i = 0; i < answer.points_size(); ++i) {
      const proto::WhatIfPoint& p = answer.points(i);
      out << (i ? ",\n " : "\n ") << "{\"devices\": " << p.devices()
          << ", \"device_memory_gib\": " << p.device_memory_gib() << ", \"batch\": "
          << p.batch_size() << ", \"schedule_option\": \"" << p.schedule_option()
          << "\", \"feasible\": " << (p.feasible() ? "true" : "false");
      if (p.feasible()) {
        out << ", \"predicted_iteration_ms\": " << p.iteration_seconds() * 1e3
            << ", \"peak_memory_bytes\": " << p.peak_bytes() << ", \"stages\": " << p.stages()
            << ", \"micro_batches\": " << p.micro_batches() << ", \"schedule\": \""
            << p.schedule() << "\", \"replicas\": \"" << p.replicas()
            << "\", \"tensor_parallel\": \"" << p.tensor_parallel() << "\"}";
      } else {
        out << ", \"error\": \"" << escaped(p.error(), false) << "\"}";
      }
    }
    out << "\n]\n";
    return;
  }
  const char* sep = csv ? "," : "  ";
  out << (csv ? "devices,device_memory_gib,batch,schedule_option,feasible,predicted_iteration_ms,"
                "peak_memory_gib,stages,micro_batches,schedule,replicas,tensor_parallel,error\n"
              : "devices  memory  batch  option  ->  iteration_ms  peak_gib  stages  micro  "
                "schedule  replicas  tp\n");
  for (const proto::WhatIfPoint& p : answer.points()) {
    std::ostringstream row;
    row << std::fixed << std::setprecision(2) << p.devices() << sep << p.device_memory_gib()
        << sep << p.batch_size() << sep << p.schedule_option() << sep;
    if (csv) row << (p.feasible() ? "true" : "false") << sep;
    if (p.feasible()) {
      row << p.iteration_seconds() * 1e3 << sep << p.peak_bytes() / 1073741824.0 << sep
          << p.stages() << sep << p.micro_batches() << sep << p.schedule() << sep
          << (csv ? "\"" + p.replicas() + "\"" : p.replicas()) << sep
          << (csv ? "\"" + p.tensor_parallel() + "\"" : p.tensor_parallel()) << (csv ? sep : "");
    } else {
      row << (csv ? sep + std::string(sep) + sep + sep + sep + sep + sep + "\"" +
                        escaped(p.error(), true) + "\""
                  : "does not fit: " + p.error().substr(0, 120));
    }
    out << row.str() << "\n";
  }
}

}  // namespace

std::string whatIfUsage() {
  return "usage: autostage whatif (--graph FILE [--profile FILE] | --synthetic SPEC)\n"
         "         --devices N[,N...] --device-memory 40GiB[,80GiB...] --batch B[,B...]\n"
         "         (--device-memory may be left to --device-preset)\n"
         "         [--schedule auto|gpipe|1f1b[,...]] [--devices-per-node K] [--usage U]\n"
         "         [--server unix:PATH|tcp:HOST:PORT [--timeout-s S]] [--csv | --json]\n"
         "         and the planner options of `autostage plan`\n"
         "  Plans every combination and prints, per point, the predicted iteration time, peak\n"
         "  memory and plan shape, or why nothing fits. Without --server it plans here.\n";
}

int runWhatIfCommand(const std::vector<std::string>& args, std::ostream& out) {
  Arguments a(args, kWhatIfValued, kFlags);
  if (a.has("help")) {
    out << whatIfUsage();
    return 0;
  }
  for (const char* required : {"devices", "batch"})
    AUTOSTAGE_CHECK_AS(ConfigError, a.has(required), "missing --", required, "\n", whatIfUsage());
  // --schedule is a list here: the options take the first (each point sets its own).
  std::vector<std::string> optionArgs;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--schedule" || args[i] == "--devices" || args[i] == "--batch" ||
        args[i] == "--device-memory" || args[i] == "--server" || args[i] == "--timeout-s") {
      ++i;
    } else if (args[i] != "--csv" && args[i] != "--json") {
      optionArgs.push_back(args[i]);
    }
  }
  PlanOptions options = planOptions(Arguments(optionArgs, kWhatIfValued, kFlags));
  const std::vector<std::string> devices = splitList(a.get("devices")),
                                 memories = splitList(memoryArgument(a, whatIfUsage())),
                                 batches = splitList(a.get("batch")),
                                 schedules = splitList(a.get("schedule", options.schedule));
  AUTOSTAGE_CHECK_AS(ConfigError, !devices.empty() && !memories.empty() && !batches.empty(),
                     "--devices, --device-memory and --batch each need at least one value\n",
                     whatIfUsage());
  core::ClusterSpec cluster;
  proto::WhatIfCall call;
  for (const std::string& d : devices) {
    Arguments one({"--devices", d}, {"devices"}, {});
    call.add_devices(static_cast<int32_t>(one.getInt("devices", 1)));
  }
  for (const std::string& m : memories)
    call.add_device_memory_gib(parseMemorySize(m, "--device-memory") / 1073741824.0);
  for (const std::string& b : batches) {
    Arguments one({"--batch", b}, {"batch"}, {});
    call.add_batch_sizes(one.getInt("batch", 1));
  }
  for (const std::string& schedule : schedules) call.add_schedules(schedule);
  cluster = commandCluster(a, options, call.devices(0));
  cluster.memoryPerDevice = parseMemorySize(memories[0], "--device-memory");
  SavedModel model = commandModel(a, cluster.peakFlops, options);
  *call.mutable_base() =
      service::makePlanCall(model.graph, model.profile, cluster, call.batch_sizes(0), options);
  proto::WhatIfAnswer answer;
  if (a.has("server")) {
    answer = service::PlannerClient(a.get("server")).whatIf(call, a.getFloat("timeout-s", 600));
  } else {
    service::PlanningCore core("");
    answer = core.whatIf(call);
  }
  writeWhatIf(out, answer, a.has("csv"), a.has("json"));
  return 0;
}

}  // namespace autostage::cli
