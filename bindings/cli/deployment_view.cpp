// Deployment summaries for `autostage show` / `report`; see deployment_view.h.
#include "bindings/cli/deployment_view.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iomanip>

#include "decomposer/plan.h"

namespace autostage::cli {

MemoryParts memoryParts(const core::StageDeployment& s) {
  MemoryParts m;
  m.params = static_cast<double>(s.paramBytes);
  m.gradients = static_cast<double>(s.gradientBytes);
  m.optimizer = static_cast<double>(s.optimizerBytes);
  m.activations = static_cast<double>(s.activationBytes);
  m.comm = static_cast<double>(s.commBufferBytes);
  // Older files record neither gradients nor working bytes: the rest of the total is shown as
  // working memory so that the parts always add up to the recorded total.
  m.working = static_cast<double>(s.workingBytes);
  const double rest = static_cast<double>(s.totalMemoryBytes) - m.total();
  if (rest > 1024) m.working += rest;  // not rounding noise
  return m;
}

int devicesPerNode(const core::Deployment& d) {
  return d.devicesPerNode > 0 ? d.devicesPerNode : d.worldSize;
}

decomposer::SimulationResult simulateDeployment(const core::Deployment& d) {
  std::vector<decomposer::StageTiming> timings;
  for (const core::StageDeployment& s : d.stages)
    timings.push_back({s.forwardSeconds, s.sendForwardSeconds, s.backwardSeconds,
                       s.sendBackwardSeconds, s.allreduceSeconds});
  return decomposer::simulateTimeline(timings, d.microBatchCount, decomposer::parseSchedule(d.schedule),
                                      d.virtualStages);
}

std::string formatSeconds(double seconds) {
  char buffer[64];
  if (seconds >= 1) {
    std::snprintf(buffer, sizeof buffer, "%.3g s", seconds);
  } else if (seconds == 0) {
    return "0";
  } else if (seconds >= 1e-3) {
    std::snprintf(buffer, sizeof buffer, "%.3g ms", seconds * 1e3);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.3g us", seconds * 1e6);
  }
  return buffer;
}

std::string formatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) bytes /= 1024, ++unit;
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, unit == 0 ? "%.0f %s" : "%.2f %s", bytes, units[unit]);
  return buffer;
}

std::string formatRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string hostNames(const core::Deployment& d, const std::vector<int>& ranks) {
  if (d.rankHosts.empty()) return "";
  std::string names;
  for (const core::HostRanks& entry : core::ranksByHost(d.rankHosts, ranks))
    names += (names.empty() ? "" : ", ") + entry.host;
  return names;
}

namespace {

// The partition log's host lines (Note [Hosts in the log] in driver/module.cpp); nothing for a
// one-host deployment.
void printHosts(std::ostream& out, const core::Deployment& d) {
  if (d.rankHosts.empty()) return;
  out << "hosts: " << core::hostsText(d.rankHosts) << "\n"
      << "stages on hosts: " << core::stageHostsText(d) << "\n";
}

void printStages(std::ostream& out, const core::Deployment& d) {
  out << "stages:\n"
      << "  " << std::left << std::setw(16) << "name" << std::right << std::setw(7) << "nodes"
      << std::setw(12) << "ranks" << std::setw(9) << "replicas" << std::setw(4) << "tp"
      << std::setw(10) << "recompute"
      << std::setw(6) << "zero" << std::setw(9) << "mb/rep" << "\n";
  for (const core::StageDeployment& s : d.stages)
    out << "  " << std::left << std::setw(16) << s.name << std::right << std::setw(7)
        << s.nodes.size() << std::setw(12) << formatRanks(s.ranks) << std::setw(9)
        << s.replicaCount() << std::setw(4) << s.tensorParallel << std::setw(10)
        << (s.recompute ? "yes" : "no")
        << std::setw(6) << (s.zero ? "1" : "0") << std::setw(9)
        << (s.microBatchPerReplica > 0 ? std::to_string(s.microBatchPerReplica) : "?") << "\n";
}

void printTimes(std::ostream& out, const core::Deployment& d, const decomposer::SimulationResult& sim) {
  out << "predicted times per micro-batch (per replica):\n"
      << "  " << std::left << std::setw(16) << "stage" << std::right << std::setw(11) << "forward"
      << std::setw(11) << "backward" << std::setw(11) << "send fwd" << std::setw(11) << "send bwd"
      << std::setw(11) << "allreduce" << std::setw(11) << "busy/iter" << "\n";
  for (size_t i = 0; i < d.stages.size(); ++i) {
    const core::StageDeployment& s = d.stages[i];
    out << "  " << std::left << std::setw(16) << s.name << std::right << std::setw(11)
        << formatSeconds(s.forwardSeconds) << std::setw(11) << formatSeconds(s.backwardSeconds)
        << std::setw(11) << formatSeconds(s.sendForwardSeconds) << std::setw(11)
        << formatSeconds(s.sendBackwardSeconds) << std::setw(11) << formatSeconds(s.allreduceSeconds)
        << std::setw(11) << formatSeconds(sim.stageBusySeconds[i]) << "\n";
  }
  out << "iteration: predicted " << formatSeconds(d.predictedIterationSeconds) << " (planner), simulated "
      << formatSeconds(sim.iterationSeconds) << " (pipeline " << formatSeconds(sim.pipelineSeconds)
      << ", bubble " << std::fixed << std::setprecision(1) << sim.bubbleFraction * 100 << "%)\n";
  out.unsetf(std::ios::fixed);
  out << std::setprecision(6);
}

void printMemory(std::ostream& out, const core::Deployment& d) {
  out << "memory per device: device " << formatBytes(static_cast<double>(d.deviceMemory))
      << ", margin " << memoryMargin(d) * 100 << "%, usable " << formatBytes(usableMemory(d)) << "\n"
      << "  " << std::left << std::setw(16) << "stage" << std::right;
  for (const char* h : {"params", "grads", "optimizer", "activations", "working", "comm", "total"})
    out << std::setw(12) << h;
  out << std::setw(8) << "use" << "\n";
  for (const core::StageDeployment& s : d.stages) {
    const MemoryParts m = memoryParts(s);
    out << "  " << std::left << std::setw(16) << s.name << std::right;
    for (double v : {m.params, m.gradients, m.optimizer, m.activations, m.working, m.comm, m.total()})
      out << std::setw(12) << formatBytes(v);
    const double usable = usableMemory(d);
    out << std::setw(7) << (usable > 0 ? static_cast<int>(100 * m.total() / usable + 0.5) : 0) << "%\n";
  }
}

void printRoutes(std::ostream& out, const core::Deployment& d) {
  out << "routes (" << d.routes.size() << "):\n"
      << "  " << std::right << std::setw(7) << "value" << "  " << std::left << std::setw(10) << "producer"
      << std::setw(14) << "consumers" << std::setw(8) << "output" << "gradient\n";
  for (const core::Route& r : d.routes) {
    std::string consumers;
    for (int c : r.consumerStages) consumers += (consumers.empty() ? "" : ",") + std::to_string(c);
    out << "  " << std::right << std::setw(7) << r.value << "  " << std::left << std::setw(10)
        << (r.producerStage == core::kFeederStage ? "feeder" : std::to_string(r.producerStage))
        << std::setw(14) << (consumers.empty() ? "-" : consumers) << std::setw(8)
        << (r.graphOutput ? "yes" : "no") << (r.carriesGradient ? "yes" : "no") << "\n";
  }
  out << std::right;
}

}  // namespace

void printDeployment(std::ostream& out, const core::Deployment& d) {
  const decomposer::SimulationResult sim = simulateDeployment(d);
  out << "deployment of graph " << d.graphHash << " (" << d.decomposer << ")\n"
      << "world size " << d.worldSize << ", " << devicesPerNode(d) << " devices per node"
      << (d.devicesPerNode > 0 ? "" : " (not recorded)") << ", global batch " << d.batchSize
      << ", micro-batches " << d.microBatchCount << ", schedule " << core::scheduleText(d)
      << (d.virtualStages > 1 ? " (interleaved: stage k runs on the ranks of stage k mod " +
                                    std::to_string(core::pipelinePositions(d)) + ")"
                              : "")
      << "\n";
  printHosts(out, d);
  printStages(out, d);
  printTimes(out, d, sim);
  printMemory(out, d);
  printRoutes(out, d);
}

}  // namespace autostage::cli
