// The plan report page; see report_html.h. Pictures are in report_charts.cpp.
#include "bindings/cli/report_html.h"

#include <algorithm>
#include <sstream>

#include "bindings/cli/deployment_view.h"
#include "bindings/cli/svg.h"

namespace autostage::cli {
namespace {

constexpr const char* kStyle = R"(
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; margin: 24px; color: #222; max-width: 1140px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ccc; padding-bottom: 3px; }
p.note { color: #555; font-size: 13px; margin: 4px 0 8px 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f0f0f0; }
td.left, th.left { text-align: left; }
table.summary td:first-child { text-align: left; background: #f8f8f8; }
svg { display: block; margin: 6px 0; }
svg text { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; font-size: 12px; fill: #222; }
svg text.mb { font-size: 10px; }
svg text.tick { font-size: 11px; fill: #555; }
svg text.node-label { font-weight: bold; }
svg text.stage-label { font-size: 11px; }
.legend { font-size: 12px; margin: 4px 0; }
.legend span.item { white-space: nowrap; margin-right: 10px; }
.legend span.swatch { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 4px; vertical-align: -2px; border: 1px solid #777; }
details { margin-top: 8px; font-size: 13px; }
)";

std::string box(const std::string& color) {
  return "<span class=\"swatch\" style=\"background:" + color + "\"></span>";
}

// A legend entry that never wraps between its colour and its label.
std::string swatch(const std::string& color, const std::string& label) {
  return "<span class=\"item\">" + box(color) + escapeXml(label) + "</span>";
}

void summaryTable(std::ostream& out, const core::Deployment& d, const decomposer::SimulationResult& sim) {
  double peak = 0;
  for (const core::StageDeployment& s : d.stages) peak = std::max(peak, memoryParts(s).total());
  const std::pair<std::string, std::string> rows[] = {
      {"decomposer", d.decomposer},
      {"graph hash", d.graphHash},
      {"world size", std::to_string(d.worldSize) + " ranks, " + std::to_string(devicesPerNode(d)) +
                         " per node" + (d.devicesPerNode > 0 ? "" : " (not recorded)")},
      {"stages", std::to_string(d.stages.size())},
      {"global batch", std::to_string(d.batchSize)},
      {"micro-batches", std::to_string(d.microBatchCount)},
      {"schedule", core::scheduleText(d)},
      {"predicted iteration (planner)", formatSeconds(d.predictedIterationSeconds)},
      {"simulated iteration", formatSeconds(sim.iterationSeconds) + " (pipeline " +
                                  formatSeconds(sim.pipelineSeconds) + ", bubble " +
                                  std::to_string(static_cast<int>(sim.bubbleFraction * 100 + 0.5)) + "%)"},
      {"device memory", formatBytes(static_cast<double>(d.deviceMemory)) + ", margin " +
                            std::to_string(static_cast<int>(memoryMargin(d) * 100 + 0.5)) + "%, usable " +
                            formatBytes(usableMemory(d))},
      {"peak memory per device", formatBytes(peak)}};
  out << "<table class=\"summary\" id=\"summary\">\n";
  for (const auto& [key, value] : rows)
    out << "<tr><td>" << escapeXml(key) << "</td><td class=\"left\">" << escapeXml(value) << "</td></tr>\n";
  out << "</table>\n";
}

void stageTable(std::ostream& out, const core::Deployment& d, const decomposer::SimulationResult& sim) {
  const bool hosts = !d.rankHosts.empty();
  out << "<table id=\"stages\">\n<tr><th class=\"left\">stage</th><th>nodes</th><th>ranks</th>"
      << (hosts ? "<th class=\"left\">hosts</th>" : "")
      << "<th>replicas</th><th>tp</th><th>recompute</th><th>zero</th><th>forward</th><th>backward</th>"
         "<th>send fwd</th><th>send bwd</th><th>allreduce</th><th>busy / iter</th><th>memory</th>"
         "</tr>\n";
  for (size_t i = 0; i < d.stages.size(); ++i) {
    const core::StageDeployment& s = d.stages[i];
    out << "<tr><td class=\"left\">" << swatch(stageColor(s.id), "S" + std::to_string(s.id) + " " + s.name)
        << "</td><td>" << s.nodes.size() << "</td><td>" << formatRanks(s.ranks) << "</td>"
        << (hosts ? "<td class=\"left\">" + escapeXml(hostNames(d, s.ranks)) + "</td>" : "")
        << "<td>" << s.replicaCount() << "</td><td>" << s.tensorParallel << "</td><td>"
        << (s.recompute ? "yes" : "no") << "</td><td>"
        << (s.zero ? "1" : "0") << "</td>";
    for (double t : {s.forwardSeconds, s.backwardSeconds, s.sendForwardSeconds, s.sendBackwardSeconds,
                     s.allreduceSeconds, sim.stageBusySeconds[i]})
      out << "<td>" << formatSeconds(t) << "</td>";
    out << "<td>" << formatBytes(memoryParts(s).total()) << "</td></tr>\n";
  }
  out << "</table>\n<p class=\"note\">Times are per micro-batch and replica"
      << (d.stages.empty() || d.stages[0].microBatchPerReplica <= 0
              ? ""
              : " (" + std::to_string(d.stages[0].microBatchPerReplica) + " samples on stage 0)")
      << "; busy / iter is the stage's total work in one iteration.</p>\n";
}

// Note [Hosts of a deployment]: each host's ranks and the stages with a replica there; nothing
// for a one-host deployment.
void hostTable(std::ostream& out, const core::Deployment& d) {
  if (d.rankHosts.empty()) return;
  out << "<h2>Hosts</h2>\n<table id=\"hosts\">\n<tr><th class=\"left\">host</th><th>ranks</th>"
         "<th class=\"left\">stages</th></tr>\n";
  for (const core::HostRanks& host : core::ranksByHost(d.rankHosts)) {
    out << "<tr><td class=\"left\">" << escapeXml(host.host) << "</td><td>"
        << formatRanks(host.ranks) << "</td><td class=\"left\">";
    for (const core::StageDeployment& s : d.stages)
      if (std::any_of(s.ranks.begin(), s.ranks.end(),
                      [&](int rank) { return d.rankHosts[rank] == host.host; }))
        out << swatch(stageColor(s.id), "S" + std::to_string(s.id) + " " + s.name);
    out << "</td></tr>\n";
  }
  out << "</table>\n";
}

void routeTable(std::ostream& out, const core::Deployment& d) {
  out << "<details><summary>" << d.routes.size() << " routes (values crossing stages)</summary>\n"
      << "<table id=\"routes\">\n<tr><th>value</th><th>producer</th><th>consumers</th>"
         "<th>graph output</th><th>gradient</th></tr>\n";
  for (const core::Route& r : d.routes) {
    std::string consumers;
    for (int c : r.consumerStages) consumers += (consumers.empty() ? "S" : ", S") + std::to_string(c);
    out << "<tr><td>" << r.value << "</td><td>"
        << (r.producerStage == core::kFeederStage ? "feeder" : "S" + std::to_string(r.producerStage))
        << "</td><td>" << (consumers.empty() ? "-" : consumers) << "</td><td>" << (r.graphOutput ? "yes" : "no")
        << "</td><td>" << (r.carriesGradient ? "yes" : "no") << "</td></tr>\n";
  }
  out << "</table>\n</details>\n";
}

void ganttLegend(std::ostream& out, const core::Deployment& d) {
  out << "<div class=\"legend\">forward (light) and backward (dark) per stage:";
  for (const core::StageDeployment& s : d.stages)
    out << "<span class=\"item\">" << box(stageColor(s.id)) << box(stageColor(s.id, true)) << "S" << s.id
        << "</span>";
  out << "</div>\n<div class=\"legend\">" << swatch("#9e9e9e", "send / recv")
      << swatch("#3b3b3b", "gradient allreduce") << " &#8212; numbers in boxes are micro-batches</div>\n";
}

void measuredMemoryNote(std::ostream& out, long step) {
  out << "<p class=\"note\">Thin bars: each rank's measured peak in step " << step
      << " of the runtime trace, under its stage's predicted bar; the transient part is everything "
      << "allocated during the step beyond parameters, gradients and optimizer state. In brackets: "
      << "measured / predicted - 1.</p>\n<div class=\"legend\">"
      << "measured bars: params, gradients and optimizer as above, and"
      << swatch(kTransientColor, "transient") << "</div>\n";
}

// One row per rank: its measured peak against its stage's prediction and the usable memory.
void measuredMemoryTable(std::ostream& out, const std::vector<MeasuredMemory>& measured) {
  out << "<table id=\"measured-memory\">\n<tr><th>rank</th><th>stage</th><th>predicted</th>"
         "<th>measured</th><th>difference</th><th>params</th><th>grads</th><th>optimizer</th>"
         "<th>transient</th><th>usable</th><th class=\"left\">limit</th></tr>\n";
  auto bytes = [](int64_t b) { return "<td>" + formatBytes(static_cast<double>(b)) + "</td>"; };
  for (const MeasuredMemory& m : measured) {
    const bool over = m.usable > 0 && m.measuredPeak > m.usable;
    out << "<tr><td>" << m.rank << "</td><td>" << (m.stage >= 0 ? "S" + std::to_string(m.stage) : "-")
        << "</td>" << bytes(m.predicted) << bytes(m.measuredPeak) << "<td>"
        << (m.predicted > 0 ? formatPercentChange(m.measuredPeak, m.predicted) : "-") << "</td>"
        << bytes(m.parameters) << bytes(m.gradients) << bytes(m.optimizer) << bytes(m.transient)
        << (m.usable > 0 ? bytes(m.usable) : "<td>-</td>")
        << (over ? "<td class=\"left over\" style=\"color:#d62728;font-weight:bold\">over usable</td>"
                 : "<td class=\"left\">ok</td>")
        << "</tr>\n";
  }
  out << "</table>\n<p class=\"note\">difference = measured / predicted - 1.</p>\n";
}

}  // namespace

std::string renderReportHtml(const ReportInput& input) {
  const core::Deployment& d = input.deployment;
  const decomposer::SimulationResult sim = simulateDeployment(d);
  double timeScale = std::max(sim.iterationSeconds, 1e-9);
  if (input.trace) timeScale = std::max(timeScale, input.trace->spanSeconds());
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>"
      << escapeXml(input.title) << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n"
      << "<h1>" << escapeXml(input.title) << "</h1>\n";
  if (!input.source.empty()) out << "<p class=\"note\">" << escapeXml(input.source) << "</p>\n";
  out << "<h2>Summary</h2>\n";
  summaryTable(out, d, sim);
  out << "<h2>Stages</h2>\n";
  stageTable(out, d, sim);
  routeTable(out, d);
  hostTable(out, d);
  out << "<h2>Stage and rank assignment</h2>\n<p class=\"note\">Each box is a rank (device), grouped "
         "by node and coloured by the stage it runs; replicas of a stage share its colour.</p>\n"
      << rankAssignmentSvg(d) << "<h2>Memory per device</h2>\n<p class=\"note\">Predicted peak per "
      << "device of each stage (all its replicas are equal); the dashed line is the usable memory "
      << "(device memory minus the planner's margin).</p>\n<div class=\"legend\">"
      << swatch("#4e79a7", "params") << swatch("#a0cbe8", "gradients") << swatch("#f28e2b", "optimizer")
      << swatch("#59a14f", "activations") << swatch("#b6992d", "working") << swatch("#e15759", "comm buffers")
      << "</div>\n";
  const std::vector<MeasuredMemory> noMemory;
  const std::vector<MeasuredMemory>& measured = input.trace ? input.trace->memory : noMemory;
  if (!measured.empty()) measuredMemoryNote(out, input.trace->step);
  out << memorySvg(d, measured);
  if (!measured.empty()) measuredMemoryTable(out, measured);
  out << "<h2>One iteration</h2>\n";
  ganttLegend(out, d);
  out << "<p class=\"note\">Predicted by the pipeline simulator from the recorded stage times ("
      << escapeXml(core::scheduleText(d)) << ", " << d.microBatchCount << " micro-batches).</p>\n"
      << predictedGanttSvg(d, sim, timeScale);
  if (input.trace) {
    out << "<p class=\"note\">Measured: step " << input.trace->step << " of the runtime trace, same "
        << "time scale (" << formatSeconds(input.trace->spanSeconds()) << " measured vs "
        << formatSeconds(sim.iterationSeconds) << " predicted).</p>\n"
        << measuredGanttSvg(*input.trace, timeScale);
  }
  out << "</body>\n</html>\n";
  return out.str();
}

}  // namespace autostage::cli
