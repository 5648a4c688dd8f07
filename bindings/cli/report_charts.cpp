// The SVG pictures of the plan report; see report_html.h.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>

#include "bindings/cli/deployment_view.h"
#include "bindings/cli/report_html.h"
#include "bindings/cli/svg.h"

namespace autostage::cli {
namespace {

constexpr double kWidth = 1100, kLabelWidth = 170, kPlotWidth = 880;
constexpr double kRow = 30, kBar = 22;
constexpr double kMemoryPlot = 700;  // the totals are written right of the plot
constexpr double kMeasuredRow = 20, kMeasuredBar = 14;
// params, grads, optimizer, activations, working, comm (the legend in report_html.cpp)
const char* const kMemoryColors[] = {"#4e79a7", "#a0cbe8", "#f28e2b",
                                     "#59a14f", "#b6992d", "#e15759"};
const char* kSendColor = "#9e9e9e";
const char* kAllreduceColor = "#3b3b3b";

std::string attr(const std::string& name, const std::string& value) {
  return name + "=\"" + escapeXml(value) + "\"";
}

std::string ms(double seconds) { return formatSeconds(seconds); }

int stageOfRank(const core::Deployment& d, int rank) {
  for (const core::StageDeployment& s : d.stages)
    if (std::find(s.ranks.begin(), s.ranks.end(), rank) != s.ranks.end()) return s.id;
  return -1;
}

// "node 1", or "node 1: b" with the hosts of its ranks (Note [Hosts of a deployment]).
std::string nodeLabel(const core::Deployment& d, int node, int perNode) {
  std::vector<int> ranks;
  for (int rank = node * perNode; rank < std::min((node + 1) * perNode, d.worldSize); ++rank)
    ranks.push_back(rank);
  const std::string hosts = hostNames(d, ranks);
  return "node " + std::to_string(node) + (hosts.empty() ? "" : ": " + hosts);
}

// Vertical grid lines and tick labels of a time axis under rows [top, bottom).
void timeAxis(Svg& svg, double top, double bottom, double timeScale) {
  for (double t : niceTicks(timeScale)) {
    const double x = kLabelWidth + kPlotWidth * t / timeScale;
    svg.line(x, top, x, bottom, "#dddddd", "class=\"grid\"");
    svg.text(x, bottom + 16, formatSeconds(t), "middle", "class=\"tick\"");
  }
  svg.line(kLabelWidth, bottom, kLabelWidth + kPlotWidth, bottom, "#555555", "class=\"axis\"");
}

// One Gantt box with its micro-batch number when it fits.
void ganttBox(Svg& svg, double y, double start, double end, double timeScale, const std::string& fill,
              const std::string& attributes, const std::string& tooltip, int microBatch, bool darkText) {
  const double x = kLabelWidth + kPlotWidth * start / timeScale;
  const double w = std::max(kPlotWidth * (end - start) / timeScale, 0.5);
  svg.rect(x, y, w, kBar, fill, attributes + " stroke=\"#ffffff\" stroke-width=\"0.5\"", tooltip);
  if (microBatch >= 0 && w >= 14)
    svg.text(x + w / 2, y + kBar / 2 + 4, std::to_string(microBatch), "middle",
             std::string("class=\"mb\" style=\"fill:") + (darkText ? "#222222" : "#ffffff") + "\"");
  if (fill == kAllreduceColor && w >= 60)
    svg.text(x + w / 2, y + kBar / 2 + 4, "allreduce", "middle", "class=\"mb\" style=\"fill:#ffffff\"");
}

std::string safeClass(const std::string& name) {
  std::string out;
  for (char c : name) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out.empty() ? "event" : out;
}

// Rows of the memory chart: each stage's predicted bar, followed by the measured bars of the
// ranks that ran it; measured ranks of no stage in the deployment come last.
struct MemoryRow {
  size_t stageIndex = 0;                     // of the predicted bar
  const MeasuredMemory* measured = nullptr;  // a measured bar instead
  double y = 0, height = kRow;               // offset below the plot top
};

std::vector<MemoryRow> memoryRows(const core::Deployment& d,
                                  const std::vector<MeasuredMemory>& measured) {
  std::vector<MemoryRow> rows;
  std::vector<bool> placed(measured.size(), false);
  auto push = [&rows](MemoryRow row) {
    row.y = rows.empty() ? 0 : rows.back().y + rows.back().height;
    rows.push_back(row);
  };
  for (size_t i = 0; i < d.stages.size(); ++i) {
    push({i, nullptr, 0, kRow});
    for (size_t m = 0; m < measured.size(); ++m)
      if (measured[m].stage == d.stages[i].id && !placed[m]) {
        placed[m] = true;
        push({i, &measured[m], 0, kMeasuredRow});
      }
  }
  for (size_t m = 0; m < measured.size(); ++m)
    if (!placed[m]) push({0, &measured[m], 0, kMeasuredRow});
  return rows;
}

void predictedMemoryBar(Svg& svg, const core::StageDeployment& s, double y, double maximum,
                        double usable) {
  const MemoryParts m = memoryParts(s);
  const double parts[] = {m.params, m.gradients, m.optimizer, m.activations, m.working, m.comm};
  const char* names[] = {"params", "grads", "optimizer", "activations", "working", "comm"};
  svg.text(kLabelWidth - 8, y + kBar / 2 + 4, "S" + std::to_string(s.id) + " ranks " + formatRanks(s.ranks),
           "end", "class=\"row-label\"");
  double x = kLabelWidth;
  for (int p = 0; p < 6; ++p) {
    const double w = kMemoryPlot * parts[p] / maximum;
    if (parts[p] <= 0) continue;
    svg.rect(x, y, w, kBar, kMemoryColors[p],
             std::string("class=\"mem ") + names[p] + "\" " + attr("data-stage", std::to_string(s.id)),
             s.name + " " + names[p] + ": " + formatBytes(parts[p]));
    x += w;
  }
  const std::string share = usable > 0 ? " (" + std::to_string(static_cast<int>(100 * m.total() / usable + 0.5)) + "% of usable)" : "";
  svg.text(kLabelWidth + kMemoryPlot + 12, y + kBar / 2 + 4, formatBytes(m.total()) + share, "start",
           "class=\"bar-total\"");
}

// A rank's measured peak, thinner than the predicted bar above it, split like StepMemory.
void measuredMemoryBar(Svg& svg, const MeasuredMemory& m, double rowTop, double maximum) {
  const double y = rowTop + (kMeasuredRow - kMeasuredBar) / 2;
  const double parts[] = {static_cast<double>(m.parameters), static_cast<double>(m.gradients),
                          static_cast<double>(m.optimizer), static_cast<double>(m.transient)};
  const char* names[] = {"params", "grads", "optimizer", "transient"};
  const char* colors[] = {kMemoryColors[0], kMemoryColors[1], kMemoryColors[2], kTransientColor};
  const std::string rank = "rank " + std::to_string(m.rank);
  svg.text(kLabelWidth - 8, y + kMeasuredBar / 2 + 4, rank + " measured", "end",
           "class=\"row-label mb\"");
  double x = kLabelWidth;
  for (int p = 0; p < 4; ++p) {
    if (parts[p] <= 0) continue;
    const double w = kMemoryPlot * parts[p] / maximum;
    svg.rect(x, y, w, kMeasuredBar, colors[p],
             std::string("class=\"measured-mem ") + names[p] + "\" " +
                 attr("data-rank", std::to_string(m.rank)) + " " +
                 attr("data-stage", std::to_string(m.stage)),
             rank + " measured " + names[p] + ": " + formatBytes(parts[p]));
    x += w;
  }
  std::string total = formatBytes(static_cast<double>(m.measuredPeak));
  if (m.predicted > 0) total += " (" + formatPercentChange(m.measuredPeak, m.predicted) + ")";
  const bool over = m.usable > 0 && m.measuredPeak > m.usable;
  if (over) total += " over usable";
  svg.text(kLabelWidth + kMemoryPlot + 12, y + kMeasuredBar / 2 + 4, total, "start",
           std::string("class=\"bar-total mb\"") + (over ? " style=\"fill:#d62728\"" : ""));
}

}  // namespace

std::string formatPercentChange(int64_t measured, int64_t predicted) {
  char text[32];
  const double change = static_cast<double>(measured) / static_cast<double>(predicted) - 1;
  std::snprintf(text, sizeof text, "%+.1f%%", 100 * change);
  return text;
}

std::string rankAssignmentSvg(const core::Deployment& d) {
  const int perNode = devicesPerNode(d);
  const int nodes = (d.worldSize + perNode - 1) / perNode;
  const int columns = std::min(perNode, 8);
  const int rowsPerNode = (perNode + columns - 1) / columns;
  const double box = 84, boxHeight = 46, gap = 8, pad = 10, header = 22;
  const double nodeWidth = columns * (box + gap) - gap + 2 * pad;
  const double nodeHeight = header + rowsPerNode * (boxHeight + gap) - gap + pad;
  const int nodesPerRow = std::max(1, static_cast<int>((kWidth + 16) / (nodeWidth + 16)));
  const int nodeRows = (nodes + nodesPerRow - 1) / nodesPerRow;
  const double width = std::min(nodes, nodesPerRow) * (nodeWidth + 16);
  Svg svg(std::max(width, 200.0), nodeRows * (nodeHeight + 16), "rank-assignment",
          "stage and rank assignment");
  for (int n = 0; n < nodes; ++n) {
    const double nx = (n % nodesPerRow) * (nodeWidth + 16), ny = (n / nodesPerRow) * (nodeHeight + 16);
    svg.rect(nx, ny, nodeWidth, nodeHeight, "#f6f6f6", "class=\"node\" stroke=\"#888888\" rx=\"6\"");
    svg.text(nx + pad, ny + 16, nodeLabel(d, n, perNode), "start", "class=\"node-label\"");
    for (int i = 0; i < perNode && n * perNode + i < d.worldSize; ++i) {
      const int rank = n * perNode + i, stage = stageOfRank(d, rank);
      const double x = nx + pad + (i % columns) * (box + gap);
      const double y = ny + header + (i / columns) * (boxHeight + gap);
      const std::string where = d.rankHosts.empty() ? "" : " on " + d.rankHosts[rank];
      const std::string tooltip = "rank " + std::to_string(rank) + where + ": " +
                                  (stage >= 0 ? d.stages[stage].name : "no stage (feeds its rows)");
      svg.rect(x, y, box, boxHeight, stage >= 0 ? stageColor(stage) : "#ffffff",
               "class=\"rank\" " + attr("data-rank", std::to_string(rank)) + " " +
                   attr("data-stage", std::to_string(stage)) + " stroke=\"#555555\" rx=\"4\"",
               tooltip);
      svg.text(x + box / 2, y + 18, "rank " + std::to_string(rank), "middle", "class=\"rank-label\"");
      svg.text(x + box / 2, y + 36, stage >= 0 ? "S" + std::to_string(stage) : "idle", "middle",
               "class=\"stage-label\"");
    }
  }
  return svg.str();
}

std::string memorySvg(const core::Deployment& d, const std::vector<MeasuredMemory>& measured) {
  const double usable = usableMemory(d), device = static_cast<double>(d.deviceMemory);
  double maximum = device;
  for (const core::StageDeployment& s : d.stages) maximum = std::max(maximum, memoryParts(s).total());
  for (const MeasuredMemory& m : measured)
    maximum = std::max({maximum, static_cast<double>(m.measuredPeak), static_cast<double>(m.usable)});
  maximum = std::max(maximum * 1.02, 1.0);
  const std::vector<MemoryRow> rows = memoryRows(d, measured);
  const double top = 42, bottom = top + (rows.empty() ? 0 : rows.back().y + rows.back().height);
  Svg svg(kWidth, bottom + 30, "memory", "memory per device against the limit");
  double unit = 1;
  while (maximum / unit >= 1024 && unit < 1099511627776.0) unit *= 1024;
  for (double t : niceTicks(maximum / unit, 8)) {
    const double x = kLabelWidth + kMemoryPlot * t * unit / maximum;
    svg.line(x, top - 4, x, bottom, "#dddddd", "class=\"grid\"");
    svg.text(x, bottom + 16, formatBytes(t * unit), "middle", "class=\"tick\"");
  }
  for (const MemoryRow& row : rows) {
    if (row.measured) {
      measuredMemoryBar(svg, *row.measured, top + row.y, maximum);
    } else {
      const double y = top + row.y + (kRow - kBar) / 2;
      predictedMemoryBar(svg, d.stages[row.stageIndex], y, maximum, usable);
    }
  }
  if (device > 0) {
    const double ux = kLabelWidth + kMemoryPlot * usable / maximum;
    const double dx = kLabelWidth + kMemoryPlot * device / maximum;
    svg.line(ux, top - 8, ux, bottom, "#d62728", "class=\"limit\" stroke-width=\"2\" stroke-dasharray=\"6 3\"");
    svg.text(ux - 4, top - 10, "usable " + formatBytes(usable), "end", "class=\"limit-label\" style=\"fill:#d62728\"");
    svg.line(dx, top - 30, dx, bottom, "#222222", "class=\"device\" stroke-width=\"2\"");
    svg.text(dx - 4, top - 26, "device " + formatBytes(device), "end", "class=\"limit-label\"");
  }
  return svg.str();
}

std::string predictedGanttSvg(const core::Deployment& d, const decomposer::SimulationResult& sim,
                              double timeScale) {
  const double top = 8, bottom = top + kRow * static_cast<double>(d.stages.size());
  Svg svg(kWidth, bottom + 28, "gantt-predicted", "predicted iteration (pipeline simulator)");
  timeAxis(svg, top, bottom, timeScale);
  for (const core::StageDeployment& s : d.stages)
    svg.text(kLabelWidth - 8, top + kRow * s.id + kRow / 2 + 4, "S" + std::to_string(s.id) + " ranks " + formatRanks(s.ranks),
             "end", "class=\"row-label\"");
  for (const decomposer::SimulationEvent& e : sim.events) {
    const std::string kind = decomposer::eventKindName(e.kind);
    const bool compute = e.kind == decomposer::EventKind::Forward || e.kind == decomposer::EventKind::Backward;
    const std::string fill = e.kind == decomposer::EventKind::Allreduce ? kAllreduceColor
                             : compute ? stageColor(e.stage, e.kind == decomposer::EventKind::Backward)
                                       : kSendColor;
    const std::string attributes = "class=\"op " + kind + "\" " + attr("data-stage", std::to_string(e.stage)) +
                                   " " + attr("data-micro-batch", std::to_string(e.microBatch));
    const std::string tooltip = "S" + std::to_string(e.stage) + " " + kind +
                                (e.microBatch >= 0 ? " micro-batch " + std::to_string(e.microBatch) : "") +
                                ": " + ms(e.startSeconds) + " .. " + ms(e.endSeconds);
    const double y = top + kRow * e.stage + (kRow - kBar) / 2;
    ganttBox(svg, y, e.startSeconds, e.endSeconds, timeScale, fill, attributes, tooltip,
             compute ? e.microBatch : -1, e.kind == decomposer::EventKind::Forward);
  }
  return svg.str();
}

std::string measuredGanttSvg(const MeasuredTrace& trace, double timeScale) {
  std::map<int, int> row;
  for (int rank : trace.ranks) row.emplace(rank, static_cast<int>(row.size()));
  std::map<int, int> stageOf;
  for (const MeasuredEvent& e : trace.events)
    if (e.stage >= 0) stageOf[e.rank] = e.stage;
  const double top = 8, bottom = top + kRow * static_cast<double>(row.size());
  Svg svg(kWidth, bottom + 28, "gantt-measured", "measured step (runtime trace)");
  timeAxis(svg, top, bottom, timeScale);
  for (const auto& [rank, r] : row)
    svg.text(kLabelWidth - 8, top + kRow * r + kRow / 2 + 4,
             "rank " + std::to_string(rank) + (stageOf.count(rank) ? " (S" + std::to_string(stageOf[rank]) + ")" : ""),
             "end", "class=\"row-label\"");
  for (const MeasuredEvent& e : trace.events) {
    const bool compute = e.name == "forward" || e.name == "backward";
    const std::string fill = e.name == "allreduce" ? kAllreduceColor
                             : compute ? stageColor(std::max(e.stage, 0), e.name == "backward")
                                       : kSendColor;
    const std::string attributes = "class=\"measured " + safeClass(e.name) + "\" " +
                                   attr("data-rank", std::to_string(e.rank)) + " " +
                                   attr("data-stage", std::to_string(e.stage)) + " " +
                                   attr("data-micro-batch", std::to_string(e.microBatch));
    const std::string tooltip = "rank " + std::to_string(e.rank) + " " + e.name +
                                (e.microBatch >= 0 ? " micro-batch " + std::to_string(e.microBatch) : "") +
                                ": " + ms(e.startSeconds) + " .. " + ms(e.endSeconds);
    ganttBox(svg, top + kRow * row.at(e.rank) + (kRow - kBar) / 2, e.startSeconds,
             std::min(e.endSeconds, timeScale), timeScale, fill, attributes, tooltip,
             compute ? e.microBatch : -1, e.name == "forward");
  }
  return svg.str();
}

}  // namespace autostage::cli
