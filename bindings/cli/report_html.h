#pragma once
// `autostage report`: one self-contained HTML page (inline CSS and SVG, no script, no external
// resource) describing a deployment: summary and stage tables, the stage/rank assignment, memory
// per device against the limit, a Gantt chart of one simulated iteration and, when given, the
// measured timeline of one step from the runtime trace on the same time scale.
//
// SVG elements carry classes and data attributes so tests (and users' tools) can find them:
//   rank boxes      <rect class="rank" data-rank="r" data-stage="s">   (data-stage -1: idle)
//   memory segments <rect class="mem PART" data-stage="s">  PART: params grads optimizer
//                   activations working comm; limit lines class="limit" / "device"
//   Gantt boxes     <rect class="op KIND" data-stage="s" data-micro-batch="m">
//                   KIND: forward backward send_forward send_backward allreduce (predicted) and
//                   <rect class="measured NAME" data-rank="r" ...> (measured)

#include <optional>
#include <string>

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
std::string memorySvg(const core::Deployment& d);
std::string predictedGanttSvg(const core::Deployment& d, const decomposer::SimulationResult& sim,
                              double timeScale);
std::string measuredGanttSvg(const MeasuredTrace& trace, double timeScale);

}  // namespace autostage::cli
