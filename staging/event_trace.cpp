// The runtime event trace; see event_trace.h (Note [Trace files]).
#include "staging/event_trace.h"

#include <sstream>

#include "core/error.h"
#include "core/file_system.h"
#include "core/log.h"
#include "core/proto/file_format.h"

namespace autostage::staging {

EventTrace::EventTrace(int rank, const std::string& directory, int keepSteps)
    : rank_(rank), keepSteps_(keepSteps) {
  AUTOSTAGE_CHECK_AS(ConfigError, keepSteps >= 1, "trace_events_steps must be >= 1, got ", keepSteps);
  std::string error;  // Note [No std::filesystem next to LibTorch wheels] (core/file_system.h)
  AUTOSTAGE_CHECK_AS(ConfigError, core::createDirectories(directory, &error),
                     "trace_events_dir '", directory, "' cannot be created: ", error);
  path_ = core::joinPath(directory, "trace_rank" + std::to_string(rank) + ".json");
  core::logger("Runtime")->info("trace_events: writing the last {} steps to {}", keepSteps_, path_);
}

void EventTrace::beginStep() {
  if (open_) endStep();
  ++step_;
  open_ = true;
  steps_.push_back(Step{step_, {}, std::nullopt});
  while (static_cast<int>(steps_.size()) > keepSteps_) steps_.pop_front();
}

void EventTrace::add(const char* name, int stage, int microBatch, int64_t start, int64_t end) {
  if (steps_.empty()) beginStep();  // events before the first step (e.g. an explicit allreduce)
  steps_.back().events.push_back({name, stage, microBatch, start, end});
}

void EventTrace::addMemory(const StepMemory& memory) {
  if (steps_.empty()) beginStep();
  steps_.back().memory = memory;
  steps_.back().memoryMicros = nowMicros();
}

// Note [Trace files]: one instant event per step with the rank's memory, sizes in bytes.
void EventTrace::writeMemory(std::ostream& out, const Step& step) const {
  const StepMemory& m = *step.memory;
  out << ",\n{\"name\":\"peak_memory\",\"ph\":\"i\",\"s\":\"p\",\"ts\":" << step.memoryMicros
      << ",\"pid\":" << rank_ << ",\"tid\":0,\"args\":{\"step\":" << step.number
      << ",\"stage\":" << m.stage << ",\"measured\":" << m.measuredPeak << ",\"predicted\":" << m.predicted
      << ",\"usable\":" << m.usable << ",\"parameters\":" << m.parameters
      << ",\"gradients\":" << m.gradients << ",\"optimizer\":" << m.optimizer
      << ",\"transient\":" << m.transient << "}}";
}

std::string EventTrace::toJson() const {
  std::ostringstream out;
  out << "{\"traceEvents\":[\n"
      << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank_
      << ",\"tid\":0,\"args\":{\"name\":\"rank " << rank_ << "\"}}";
  for (const Step& step : steps_) {
    for (const Event& e : step.events)
      out << ",\n{\"name\":\"" << e.name << "\",\"ph\":\"X\",\"ts\":" << e.start
          << ",\"dur\":" << (e.end - e.start) << ",\"pid\":" << rank_
          << ",\"tid\":0,\"args\":{\"stage\":" << e.stage << ",\"micro_batch\":" << e.microBatch
          << ",\"step\":" << step.number << "}}";
    if (step.memory) writeMemory(out, step);
  }
  out << "\n],\"displayTimeUnit\":\"ms\"}\n";
  return out.str();
}

void EventTrace::endStep() {
  if (!open_) return;
  open_ = false;
  // Rewritten every step: atomic, so readers never see a partial file, but not fsynced.
  core::writeFileAtomically(path_, toJson(), "event trace", false);
}

}  // namespace autostage::staging
