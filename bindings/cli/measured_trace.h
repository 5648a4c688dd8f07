#pragma once
// Reading the runtime's Chrome-trace files (trace_events=true) for `autostage report --trace`.
//
// Each file is {"traceEvents": [{"name", "ph": "X", "ts" (us), "dur" (us), "pid": rank, "tid",
// "args": {"stage", "micro_batch", "step"}}]}; other phases and unknown fields are ignored.

#include <string>
#include <vector>

namespace autostage::cli {

struct MeasuredEvent {
  int rank = 0;
  std::string name;    // forward, backward, send, recv, send_grad, recv_grad, allreduce, ...
  int stage = -1;
  int microBatch = -1;
  long step = -1;
  double startSeconds = 0, endSeconds = 0;
};

struct MeasuredTrace {
  std::vector<MeasuredEvent> events;  // one step, times relative to its earliest event
  long step = -1;                     // the step shown
  std::vector<int> ranks;             // ascending ranks with events
  double spanSeconds() const;
};

// Parses the JSON of one trace file; throws FormatError naming `origin` and the offset.
std::vector<MeasuredEvent> parseChromeTrace(const std::string& json, const std::string& origin);

// `path` is one trace file, a comma-separated list of files, or a directory (every *.json in it).
// Keeps the last step recorded by every rank (the latest complete one), times made relative to
// its first event. Throws FormatError when no file has complete events.
MeasuredTrace loadMeasuredTrace(const std::string& path);
// The same selection over already parsed events.
MeasuredTrace selectLastStep(std::vector<MeasuredEvent> events);

}  // namespace autostage::cli
