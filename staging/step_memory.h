#pragma once
// What one rank's memory looked like during one training step, measured against the plan
// (Note [Measured memory] in staging/memory_meter.h). Plain data, torch-free: written into the
// event trace (staging/event_trace.h) and read back by `autostage report --trace`.

#include <cstdint>

namespace autostage::staging {

struct StepMemory {
  long step = -1;
  int stage = -1;              // this rank's stage, -1 when it holds none
  int64_t measuredPeak = 0;    // parameters + gradients + optimizer + transient
  int64_t predicted = 0;       // the deployment's totalMemoryBytes of this rank's stage
  int64_t usable = 0;          // device memory minus the planner's margin the plan was made for
  // The measured peak split like the plan's prediction.
  int64_t parameters = 0;      // this rank's stage parameters
  int64_t gradients = 0;       // their gradients, as held at the peak
  int64_t optimizer = 0;       // optimizer state of those parameters (as reported by the caller)
  int64_t transient = 0;       // everything else allocated during the step at its peak:
                               // activations, working memory, communication buffers
};

}  // namespace autostage::staging
