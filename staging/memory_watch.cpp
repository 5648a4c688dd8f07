// Note [Measured memory] (staging/memory_meter.h).
#include "staging/memory_watch.h"

#include <cstdio>
#include <sstream>

#include <ATen/ATen.h>

#include "comm/tensor_util.h"
#include "core/cluster_spec.h"
#include "core/log.h"

namespace autostage::staging {
namespace {

int64_t bytesOf(const at::Tensor& t) { return t.defined() ? comm::tensorBytes(t) : 0; }

int64_t tensorBytes(const ParamStorage& params) {
  int64_t total = 0;
  for (const auto& named : params.namedTensors()) total += bytesOf(named.second);
  return total;
}

int64_t gradientBytes(const ParamStorage& params) {
  int64_t total = 0;
  for (const at::Tensor& p : params.parameters()) total += bytesOf(p.grad());
  return total;
}

// "+4%" or "-12%": measured against predicted.
std::string relative(int64_t measured, int64_t predicted) {
  if (predicted <= 0) return "no prediction";
  char text[32];
  std::snprintf(text, sizeof text, "%+.0f%%", 100.0 * (double(measured) / double(predicted) - 1));
  return text;
}

std::string bytesText(int64_t bytes) { return core::formatBytes(static_cast<double>(bytes)); }

std::string describe(const StepMemory& m) {
  std::ostringstream out;
  out << "measured " << bytesText(m.measuredPeak) << ", predicted " << bytesText(m.predicted)
      << " (" << relative(m.measuredPeak, m.predicted) << ")";
  return out.str();
}

}  // namespace

MemoryWatch::MemoryWatch(std::shared_ptr<MemoryMeter> meter, const core::Deployment& deployment,
                         const std::vector<int>& stages)
    : meter_(std::move(meter)), stage_(stages.empty() ? -1 : stages.front()) {
  for (int stage : stages) predicted_ += deployment.stages[stage].totalMemoryBytes;
  usable_ = static_cast<int64_t>(core::usableMemory(deployment));
}

void MemoryWatch::begin(const ParamStorage& params) {
  if (!meter_) return;
  startGradients_ = gradientBytes(params);
  meter_->resetPeak();
  startCurrent_ = meter_->currentBytes();
  open_ = true;
}

std::optional<StepMemory> MemoryWatch::end(const ParamStorage& params, comm::Backend& backend) {
  if (!meter_ || !open_) return std::nullopt;
  open_ = false;
  StepMemory m;
  m.step = ++steps_;
  m.stage = stage_;
  m.predicted = predicted_;
  m.usable = usable_;
  m.parameters = tensorBytes(params);
  m.gradients = gradientBytes(params);
  // Resident before the step: the reported optimizer state, or what the meter saw allocated and
  // still alive then, less the gradients.
  m.optimizer = optimizerBytes_ >= 0 ? optimizerBytes_
                                     : std::max<int64_t>(0, startCurrent_ - startGradients_);
  // Gradients allocated inside the window are in its peak: reported apart.
  const int64_t grown = std::max<int64_t>(0, m.gradients - startGradients_);
  m.transient = std::max<int64_t>(0, meter_->peakBytes() - startCurrent_ - grown);
  m.measuredPeak = m.parameters + m.gradients + m.optimizer + m.transient;
  auto log = core::logger("Runtime");
  log->debug("step {} peak memory rank {}: {} (parameters {}, gradients {}, optimizer state {}, "
             "activations and other transient {}; {})", m.step,
             backend.rank(), describe(m), bytesText(m.parameters), bytesText(m.gradients),
             bytesText(m.optimizer), bytesText(m.transient), meter_->name());
  if (m.usable > 0 && m.measuredPeak > m.usable && !warned_) {
    warned_ = true;
    log->warn("rank {} used {} in step {}, more than the {} usable per device the plan was made "
              "for (predicted {}): give the planner a smaller mem_limit_gb or a larger "
              "mem_margin, or force more micro-batches (pipeline_num) or recompute",
              backend.rank(), bytesText(m.measuredPeak), m.step, bytesText(m.usable),
              bytesText(m.predicted));
  }
  if (m.step == kSummaryStep) summarize(m, backend);
  last_ = m;
  return m;
}

// One info line per rank, printed by rank 0 (other ranks print below warn only; core/log.h).
void MemoryWatch::summarize(const StepMemory& memory, comm::Backend& backend) const {
  std::string line = describe(memory);
  std::vector<std::string> lines{line};
  if (backend.worldSize() > 1) lines = backend.allGatherBytes(line, backend.world());
  if (backend.rank() != 0) return;
  auto log = core::logger("Runtime");
  for (size_t r = 0; r < lines.size(); ++r)
    log->info("peak memory rank {}: {}", r, lines[r]);
}

}  // namespace autostage::staging
