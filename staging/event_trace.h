#pragma once
// Runtime event trace (trace_events=true): per rank, wall-clock start/end of every forward,
// backward, send, receive and gradient allreduce of the executor, written as a Chrome-trace JSON
// file (chrome://tracing, Perfetto, `autostage report --trace`).
//
// Note [Trace files]
// Rank r writes `<directory>/trace_rank<r>.json`: {"traceEvents": [...]} with one complete ("X")
// event per line, "ts"/"dur" in microseconds of the system clock (comparable across ranks of one
// machine), "pid" = rank, "tid" = 0, "args" = {"stage", "micro_batch", "step"}. It holds the last
// `keepSteps` steps and is rewritten (core::writeFileAtomically, without fsync) at the end of every
// step, so the file on disk is always complete and bounded. When tracing is off the executor
// holds no EventTrace and each instrumented point costs one null-pointer test.

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

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
  std::string path() const { return path_; }
  std::string toJson() const;

 private:
  struct Event {
    const char* name;
    int stage, microBatch;
    int64_t start, end;
  };
  int rank_;
  std::string path_;
  int keepSteps_;
  long step_ = -1;
  bool open_ = false;
  std::deque<std::pair<long, std::vector<Event>>> steps_;  // oldest first
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
