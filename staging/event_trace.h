#pragma once
// Runtime event trace (trace_events=true): per rank, wall-clock start/end of every forward,
// backward, send, receive and gradient allreduce of the executor, and the rank's measured peak
// memory of each step, written as a Chrome-trace JSON file (chrome://tracing, Perfetto,
// `autostage report --trace`).
//
// Note [Trace files]
// Rank r writes `<directory>/trace_rank<r>.json`: {"traceEvents": [...]} with one complete ("X")
// event per line, "ts"/"dur" in microseconds of the system clock (comparable across ranks of one
// machine), "pid" = rank, "tid" = 0, "args" = {"stage", "micro_batch", "step"}. A step whose
// memory was recorded (addMemory) adds one process-scoped instant event after its complete ones:
//   {"name":"peak_memory","ph":"i","s":"p","ts":<us when addMemory was called>,"pid":rank,"tid":0,
//    "args":{"step","stage","measured","predicted","usable","parameters","gradients","optimizer",
//            "transient"}}
// all integers, the sizes in bytes (the StepMemory fields, staging/step_memory.h; "measured" is
// measuredPeak). Its "step" is the trace's step number, the same as its complete events', so a
// reader keeps or drops the memory together with them. It holds the last `keepSteps` steps and is
// rewritten (core::writeFileAtomically, without fsync) at the end of every step, so the file on
// disk is always complete and bounded. When tracing is off the executor holds no EventTrace and
// each instrumented point costs one null-pointer test.

#include <chrono>
#include <cstdint>
#include <deque>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "staging/step_memory.h"

namespace autostage::staging {

class EventTrace {
 public:
  // Creates `directory` if needed; throws ConfigError when it cannot be created.
  EventTrace(int rank, const std::string& directory, int keepSteps);
  static int64_t nowMicros() {
    using namespace std::chrono;
    return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
  }
  // Starts step n+1 (closing an open step first).
  void beginStep();
  // Ends the open step and rewrites the file; a no-op without an open step.
  void endStep();
  void add(const char* name, int stage, int microBatch, int64_t startMicros, int64_t endMicros);
  // Records this rank's memory of the open step (one per step: a second call replaces the first),
  // timestamped now; call it before endStep to have it in that step's file. `memory.step` is not
  // written: the event carries the trace's step number (Note [Trace files]).
  void addMemory(const StepMemory& memory);
  std::string path() const { return path_; }
  std::string toJson() const;

 private:
  struct Event {
    const char* name;
    int stage, microBatch;
    int64_t start, end;
  };
  struct Step {
    long number;
    std::vector<Event> events;
    std::optional<StepMemory> memory;
    int64_t memoryMicros = 0;  // when addMemory was called
  };
  int rank_;
  std::string path_;
  int keepSteps_;
  long step_ = -1;
  bool open_ = false;
  std::deque<Step> steps_;  // oldest first

  void writeMemory(std::ostream& out, const Step& step) const;
};

// Records [construction, destruction) as one event when `trace` is not null.
class TraceScope {
 public:
  TraceScope(EventTrace* trace, const char* name, int stage, int microBatch)
      : trace_(trace), name_(name), stage_(stage), microBatch_(microBatch),
        start_(trace ? EventTrace::nowMicros() : 0) {}
  ~TraceScope() {
    if (trace_) trace_->add(name_, stage_, microBatch_, start_, EventTrace::nowMicros());
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  EventTrace* trace_;
  const char* name_;
  int stage_, microBatch_;
  int64_t start_;
};

}  // namespace autostage::staging
