#pragma once
// `autostage report`: one self-contained HTML page (inline CSS and SVG, no script, no external
// resource) describing a deployment: summary and stage tables, for a deployment that ran on
// several hosts a hosts table (<table id="hosts">: host, ranks, stages) and a hosts column in the
// stage table (Note [Hosts of a deployment] in core/deployment.h), the stage/rank assignment,
// memory per device against the limit, a Gantt chart of one simulated iteration and, when given,
// the measured timeline of one step from the runtime trace on the same time scale.
//
// SVG elements carry classes and data attributes so tests (and users' tools) can find them:
//   rank boxes      <rect class="rank" data-rank="r" data-stage="s">   (data-stage -1: idle)
//   memory segments <rect class="mem PART" data-stage="s">  PART: params grads optimizer
//                   activations working comm; limit lines class="limit" / "device"
//                   measured, when the trace has peak_memory records:
//                   <rect class="measured-mem PART" data-rank="r" data-stage="s">  PART: params
//                   grads optimizer transient; and <table id="measured-memory">, one row per rank
//   Gantt boxes     <rect class="op KIND" data-stage="s" data-micro-batch="m">
//                   KIND: forward backward send_forward send_backward allreduce (predicted) and
//                   <rect class="measured NAME" data-rank="r" ...> (measured)

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings/cli/measured_trace.h"
#include "core/deployment.h"
#include "decomposer/simulator.h"

namespace autostage::cli {

struct ReportInput {
  core::Deployment deployment;
  std::string title = "autostage plan report";
  std::string source;                  // shown in the header, e.g. the deployment file path
  std::optional<MeasuredTrace> trace;  // measured step, when --trace was given
};

std::string renderReportHtml(const ReportInput& input);

// The SVG pictures (report_charts.cpp); `timeScale` is the seconds the Gantt width stands for.
std::string rankAssignmentSvg(const core::Deployment& d);
// `measured`: the trace's per-rank peaks, drawn under their stage's predicted bar (none: the
// predicted bars alone).
std::string memorySvg(const core::Deployment& d, const std::vector<MeasuredMemory>& measured = {});
std::string predictedGanttSvg(const core::Deployment& d, const decomposer::SimulationResult& sim,
                              double timeScale);
std::string measuredGanttSvg(const MeasuredTrace& trace, double timeScale);

// The colour of a measured peak's transient part (the predicted bars split it further).
constexpr const char* kTransientColor = "#b07aa1";
// measured / predicted - 1 as a signed percentage with one decimal, e.g. "+12.5%".
std::string formatPercentChange(int64_t measured, int64_t predicted);

}  // namespace autostage::cli
