// plan_scaling: planning time (grouping + coarsening + search + deployment; the synthetic graph
// and its profile are built before the clock starts) and peak RSS, per case:
//   - the 96-layer BERT (hidden 2048) on 32 devices of 40 GiB, batch 256, for each usage
//     (train_step, forward_backward, inference: Note [Plan usage]);
//   - a 48-layer GPT (hidden 2048, 50k vocabulary, sequence 1024) on 64 devices, batch 512;
//   - BERT-shaped graphs of about 1k, 10k and 100k IR nodes on 8, 64 and 1024 devices;
//   - with --large, about 1M nodes on 16,384 devices.
// Each case runs in a forked child so its peak RSS is its own; a case over --timeout seconds is
// reported as such. Per plan it also prints the reported estimate (iter_ms), the closed form the
// planner searched (search_ms) and the simulated iteration (sim_ms); see Note [Search objective
// and reported estimate]. With --quality N it first prints the planner's plan quality against an
// exhaustive search on 4 x N random small instances (tests/decomposer/plan_quality.h).
// bench/plan_scaling_compare builds this same source against an earlier planner and prints both
// side by side.
//
// With --phases it prints, under each case, the planner's phase times (plan --json's phase_seconds);
// with --plans, the plan (Plan::toString) and its two times to the last bit, for comparing plans
// of two builds. With --tensor-parallel every case runs twice, tensor_parallel=1 and =auto, both
// through makeBlocking + planStages (Note [Tensor-parallel cost] in decomposer/cost_model.h:
// such a plan has no deployment yet), the rows ending in the degrees the plan uses. --match TEXT
// keeps the cases whose name and device count ("bert~100k tp=auto 1024") contain TEXT.
//
//   plan_scaling [--json] [--timeout S] [--max-nodes N] [--target-only] [--large] [--quality N]
//                [--phases] [--plans] [--tensor-parallel] [--match TEXT]

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "core/error.h"
#include "decomposer/planner.h"
#include "decomposer/synthetic.h"
#include "plan_quality.h"

using namespace autostage;
using namespace autostage::decomposer;

namespace {

struct Case {
  std::string label;
  TransformerShape shape;
  int devices;
  int64_t batch;
  PlanUsage usage = PlanUsage::TrainStep;
  // Set (--tensor-parallel): the option's value, planned by makeBlocking + planStages (builds
  // before 66d128f refused to deploy such plans, so both sides of a comparison plan alike), the
  // row's label gaining " tp=<value>".
  std::string tensorParallel;
};

struct Outcome {
  double planSeconds = -1;
  double planCpuSeconds = -1;  // this process's CPU time over the same span (the machine is shared)
  int nodes = 0, blocks = 0, stages = 0, microBatches = 0, virtualStages = 1;
  double iterationMs = 0;   // the plan's reported estimate
  double searchMs = 0;      // the closed form the planner searched
  double simulatedMs = 0;   // the pipeline simulator's iteration time of the plan
  char error[160] = "";
  char phases[4096] = "";  // with --phases: "name: seconds" per line (PlanResult's phases)
  char plan[8192] = "";    // with --plans: the plan's text and its times to the last bit
  char degrees[64] = "";   // the plan's tensor-parallel degrees, e.g. "tp 1,4"
};

// One line of --phases: the phase's seconds and name.
std::string phaseLine(const std::string& name, double seconds) {
  return "    " + std::to_string(seconds).substr(0, 8) + " s  " + name + "\n";
}

// Plans `c` with its tensor_parallel option through makeBlocking + planStages (the planner's
// part of planGraph without the deployment), timed the same way.
void planTensorParallel(const Case& c, const SyntheticModel& m, const core::ClusterSpec& cluster,
                        PlanOptions options, Outcome& o) {
  options.tensorParallel = c.tensorParallel;
  const std::clock_t cpuStart = std::clock();
  const auto start = std::chrono::steady_clock::now();
  const Blocking blocking = makeBlocking(m.graph, m.profile, cluster, c.batch, options);
  const double blockingSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Plan plan = planStages(blocking.request);
  o.planSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  o.planCpuSeconds = static_cast<double>(std::clock() - cpuStart) / CLOCKS_PER_SEC;
  const PlanEvaluation e = evaluatePlan(blocking.request, plan);
  o.blocks = blocking.blockCount();
  o.stages = static_cast<int>(plan.stages.size());
  o.microBatches = plan.microBatchCount;
  o.virtualStages = plan.virtualStages;
  o.iterationMs = e.iterationSeconds * 1e3;
  o.searchMs = e.searchSeconds * 1e3;
  o.simulatedMs = simulatePlan(blocking.request, plan).iterationSeconds * 1e3;
  std::string degrees;
  for (int t : {1, 2, 4, 8})
    for (const StagePlan& s : plan.stages)
      if (s.tensorParallel == t) {
        degrees += (degrees.empty() ? "tp " : ",") + std::to_string(t);
        break;
      }
  std::snprintf(o.degrees, sizeof o.degrees, "%s", degrees.c_str());
  std::string phases = phaseLine("blocking (makeBlocking)", blockingSeconds);
  for (const auto& [name, seconds] : plan.phaseSeconds) phases += phaseLine(name, seconds);
  std::snprintf(o.phases, sizeof o.phases, "%s", phases.c_str());
  std::snprintf(o.plan, sizeof o.plan, "    %s\n    predicted %.17g search %.17g\n",
                plan.toString().c_str(), plan.predictedSeconds, plan.searchSeconds);
}

Outcome runCase(const Case& c) {
  Outcome o;
  SyntheticModel m = syntheticTransformer(c.shape, DeviceModel{});
  m.profile.comm.p2pIntraNode = m.profile.comm.allreduceIntraNode = {5e-6, 150e9};
  m.profile.comm.p2pInterNode = m.profile.comm.allreduceInterNode = {2e-5, 12.5e9};
  core::ClusterSpec cluster;
  cluster.devices = c.devices;
  cluster.devicesPerNode = 8;
  cluster.memoryPerDevice = int64_t{40} << 30;
  o.nodes = static_cast<int>(m.graph.nodeCount());
  try {
    PlanOptions options;
    options.usage = c.usage;
    if (!c.tensorParallel.empty()) {
      planTensorParallel(c, m, cluster, options, o);
      return o;
    }
    const std::clock_t cpuStart = std::clock();
    PlanResult r = planGraph(m.graph, m.profile, cluster, c.batch, options);
    // planSeconds excludes the simulation planGraph runs after the deployment; so does this,
    // approximately: the simulation of a few stages is negligible.
    o.planCpuSeconds = static_cast<double>(std::clock() - cpuStart) / CLOCKS_PER_SEC;
    o.planSeconds = r.planSeconds;
    o.blocks = r.blocking.blockCount();
    o.stages = static_cast<int>(r.plan.stages.size());
    o.microBatches = r.plan.microBatchCount;
    o.virtualStages = r.plan.virtualStages;
    o.iterationMs = r.evaluation.iterationSeconds * 1e3;
    o.searchMs = r.evaluation.searchSeconds * 1e3;
    o.simulatedMs = r.simulation.iterationSeconds * 1e3;
    std::string phases;
    for (const auto& [name, seconds] : r.plan.phaseSeconds) phases += phaseLine(name, seconds);
    std::snprintf(o.phases, sizeof o.phases, "%s", phases.c_str());
    std::snprintf(o.plan, sizeof o.plan, "    %s\n    predicted %.17g search %.17g\n",
                  r.plan.toString().c_str(), r.plan.predictedSeconds, r.plan.searchSeconds);
  } catch (const Error& e) {
    std::snprintf(o.error, sizeof o.error, "%s", e.what());
  }
  return o;
}

// Runs the case in a child; returns its outcome and peak RSS in MiB (-1 on timeout or crash).
Outcome runIsolated(const Case& c, int timeoutSeconds, double* rssMiB) {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    alarm(static_cast<unsigned>(timeoutSeconds));
    Outcome o = runCase(c);
    ssize_t written = write(fds[1], &o, sizeof o);
    _exit(written == static_cast<ssize_t>(sizeof o) ? 0 : 1);
  }
  close(fds[1]);
  Outcome o;
  ssize_t got = read(fds[0], &o, sizeof o);
  close(fds[0]);
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  *rssMiB = usage.ru_maxrss / 1024.0;
  if (got != static_cast<ssize_t>(sizeof o)) {
    o = Outcome{};
    std::snprintf(o.error, sizeof o.error, "%s", WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM
                                                     ? "timeout" : "child failed");
  }
  return o;
}

Case bertCase(int targetNodes, int devices) {
  Case c;
  c.shape.hidden = 1024;
  c.shape.heads = 16;
  c.shape.sequence = 512;
  c.shape.layers = std::max(1, (targetNodes - 20) / kTransformerLayerNodes);
  c.devices = devices;
  c.batch = std::max<int64_t>(64, 2 * devices);
  c.label = "bert~" + std::to_string(targetNodes / 1000) + "k";
  return c;
}

const char* usageLabel(PlanUsage usage) {
  switch (usage) {
    case PlanUsage::TrainStep:
      return "train_step";
    case PlanUsage::ForwardBackward:
      return "fwd_bwd";
    case PlanUsage::Inference:
      return "inference";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false, targetOnly = false, large = false, phases = false, plans = false;
  bool tensorParallel = false;
  int timeout = 600, maxNodes = 100000, quality = 0;
  const char* match = nullptr;  // --match: only the cases whose "<case> <devices>" contains it
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--target-only")) targetOnly = true;
    else if (!std::strcmp(argv[i], "--large")) large = true;
    else if (!std::strcmp(argv[i], "--phases")) phases = true;
    else if (!std::strcmp(argv[i], "--plans")) plans = true;
    else if (!std::strcmp(argv[i], "--tensor-parallel")) tensorParallel = true;
    else if (!std::strcmp(argv[i], "--timeout") && i + 1 < argc) timeout = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--max-nodes") && i + 1 < argc) maxNodes = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quality") && i + 1 < argc) quality = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--match") && i + 1 < argc) match = argv[++i];
    else {
      std::fprintf(stderr, "usage: plan_scaling [--json] [--timeout S] [--max-nodes N] "
                           "[--target-only] [--large] [--quality N] [--phases] [--plans] "
                           "[--tensor-parallel] [--match 'CASE DEVICES']\n");
      return 2;
    }
  }
  if (quality > 0) {
    const testing::QualityReport report =
        testing::measurePlanQuality(4242, quality, [](const testing::QualityCase&) {});
    std::printf(json ? "{\"quality\": \"%s\"}\n" : "%s\n", report.summary().c_str());
    std::fflush(stdout);
  }
  std::vector<Case> cases;
  for (PlanUsage usage : {PlanUsage::TrainStep, PlanUsage::ForwardBackward, PlanUsage::Inference}) {
    Case target;
    target.label = "bert-96L-2048";
    target.shape.layers = 96;
    target.shape.hidden = 2048;
    target.shape.heads = 32;
    target.shape.sequence = 512;
    target.devices = 32;
    target.batch = 256;
    target.usage = usage;
    cases.push_back(target);
  }
  if (!targetOnly) {
    Case gpt;
    gpt.label = "gpt-48L-2048";
    gpt.shape.layers = 48;
    gpt.shape.hidden = 2048;
    gpt.shape.heads = 16;
    gpt.shape.sequence = 1024;
    gpt.shape.vocabulary = 50257;
    gpt.shape.causal = true;
    gpt.devices = 64;
    gpt.batch = 512;
    cases.push_back(gpt);
    for (int nodes : {1000, 10000, 100000})
      for (int devices : {8, 64, 1024})
        if (nodes <= maxNodes) cases.push_back(bertCase(nodes, devices));
    if (large) cases.push_back(bertCase(1000000, 16384));
  }
  if (tensorParallel) {  // each case twice, side by side: without and with t in the search
    std::vector<Case> pairs;
    for (const Case& c : cases)
      for (const char* value : {"1", "auto"}) {
        Case d = c;
        d.tensorParallel = value;
        d.label += std::string(" tp=") + value;
        pairs.push_back(d);
      }
    cases = pairs;
  }
  if (match)
    cases.erase(std::remove_if(cases.begin(), cases.end(),
                               [&](const Case& c) {
                                 const std::string name = c.label + " " + std::to_string(c.devices);
                                 return name.find(match) == std::string::npos;
                               }),
                cases.end());
  if (!json)
    std::printf("%-14s %-10s %6s %8s %6s %6s %6s %6s %11s %11s %11s %8s %10s %8s\n", "case",
                "usage", "layers", "nodes", "devs", "batch", "blocks", "stg/v", "iter_ms",
                "search_ms", "sim_ms", "plan_s", "plan_cpu_s", "rss_MiB");
  for (const Case& c : cases) {
    double rss = -1;
    Outcome o = runIsolated(c, timeout, &rss);
    if (json) {
      std::printf("{\"case\": \"%s\", \"usage\": \"%s\", \"layers\": %d, \"nodes\": %d, "
                  "\"devices\": %d, \"batch\": %lld, \"blocks\": %d, \"stages\": %d, "
                  "\"virtual_stages\": %d, \"micro_batches\": %d, "
                  "\"predicted_iteration_ms\": %.3f, \"search_objective_ms\": %.3f, "
                  "\"simulated_iteration_ms\": %.3f, \"plan_seconds\": %.3f, "
                  "\"plan_cpu_seconds\": %.3f, \"peak_rss_mib\": %.1f, \"tensor_parallel\": "
                  "\"%s\", \"error\": \"%s\"}\n",
                  c.label.c_str(), usageLabel(c.usage), c.shape.layers, o.nodes, c.devices,
                  static_cast<long long>(c.batch), o.blocks, o.stages, o.virtualStages,
                  o.microBatches, o.iterationMs, o.searchMs, o.simulatedMs, o.planSeconds,
                  o.planCpuSeconds, rss, o.degrees, o.error);
    } else {
      const std::string shape = std::to_string(o.stages) + "/" + std::to_string(o.virtualStages);
      std::printf("%-14s %-10s %6d %8d %6d %6lld %6d %6s %11.2f %11.2f %11.2f %8.3f %10.3f %8.1f %s%s%s\n",
                  c.label.c_str(), usageLabel(c.usage), c.shape.layers, o.nodes, c.devices,
                  static_cast<long long>(c.batch), o.blocks, shape.c_str(), o.iterationMs,
                  o.searchMs, o.simulatedMs, o.planSeconds, o.planCpuSeconds, rss, o.degrees,
                  o.degrees[0] && o.error[0] ? " " : "", o.error);
      if (phases) std::printf("%s", o.phases);
      if (plans) std::printf("%s", o.plan);
    }
    std::fflush(stdout);
  }
  return 0;
}
