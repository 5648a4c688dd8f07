#pragma once
// Reading the runtime's Chrome-trace files (trace_events=true) for `autostage report --trace`.
//
// Each file is {"traceEvents": [{"name", "ph": "X", "ts" (us), "dur" (us), "pid": rank, "tid",
// "args": {"stage", "micro_batch", "step"}}]} plus, per step whose memory was measured, one
// {"name": "peak_memory", "ph": "i", "pid": rank, "args": {"step", "stage", "measured", ...}}
// (Note [Trace files] in staging/event_trace.h); other phases and unknown fields are ignored.
// Files written before the peak_memory events existed read as traces without memory.

#include <string>
#include <vector>

#include "staging/step_memory.h"  // plain data, torch-free

namespace autostage::cli {

struct MeasuredEvent {
  int rank = 0;
  std::string name;    // forward, backward, send, recv, send_grad, recv_grad, allreduce, ...
  int stage = -1;
  int microBatch = -1;
  long step = -1;
  double startSeconds = 0, endSeconds = 0;
};

// One rank's measured memory of one step: the StepMemory fields as the trace file holds them
// ("step" is the trace's step number).
struct MeasuredMemory : staging::StepMemory {
  int rank = 0;
};

// Everything one trace file holds that the report reads.
struct TraceRecords {
  std::vector<MeasuredEvent> events;
  std::vector<MeasuredMemory> memory;
};

struct MeasuredTrace {
  std::vector<MeasuredEvent> events;  // one step, times relative to its earliest event
  std::vector<MeasuredMemory> memory;  // that step's records, ascending rank (empty: not measured)
  long step = -1;                     // the step shown
  std::vector<int> ranks;             // ascending ranks with events
  double spanSeconds() const;
};

// Parses the JSON of one trace file; throws FormatError naming `origin` and the offset, or the
// event and field of a peak_memory event whose field is missing or not an integer.
TraceRecords parseTraceRecords(const std::string& json, const std::string& origin);
// Its complete ("X") events only.
std::vector<MeasuredEvent> parseChromeTrace(const std::string& json, const std::string& origin);

// `path` is one trace file, a comma-separated list of files, or a directory (every *.json in it).
// Keeps the last step recorded by every rank (the latest complete one), times made relative to
// its first event. Throws FormatError when no file has complete events.
MeasuredTrace loadMeasuredTrace(const std::string& path);
// The same selection over already parsed events; `memory` is filtered to the step selected.
MeasuredTrace selectLastStep(std::vector<MeasuredEvent> events,
                             std::vector<MeasuredMemory> memory = {});

}  // namespace autostage::cli
