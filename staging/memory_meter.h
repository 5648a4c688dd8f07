#pragma once
// How the runtime reads the memory a rank allocates (Note [Measured memory]). Torch-free: the
// layer that builds a module injects the implementation for its device (bindings/cpp: the
// profiler's counting CPU allocator; a CUDA build: the caching allocator's statistics).
//
// Note [Measured memory]
// Every step each rank measures the peak memory it really used and sets it beside what the plan
// predicted for its stage (StageDeployment::totalMemoryBytes). The step window opens when a
// training step starts (forward(), trainStep()) and closes when it ends (backward() after a
// forward with gradients, the end of trainStep or of an inference forward), so it spans the
// caller's loss computation too. The figures are split like the plan's prediction:
//   parameters  bytes of this rank's parameters and buffers (exact)
//   gradients   bytes of their gradients at the end of the step (exact)
//   optimizer   bytes of the optimizer state of those parameters, as the caller's optimizer
//               holds it at the start of the step (exact; autostage.Module reports it every
//               call). Unreported (C++ without Module::setOptimizerStateBytes): what the meter
//               saw allocated and alive at the start, less the gradients.
//   transient   the meter's peak during the step above its level at the start, less the
//               gradients allocated in it: activations, working memory, communication buffers
//   measured    the sum of the four.
// Only the transient part comes from the meter, as growth within the window: tensors the process
// holds for other reasons (a reference model, data) do not count, and storages the meter cannot
// see (Python's storage constructor, used by copy.deepcopy and by optimizer.load_state_dict,
// bypasses the CPU allocator) do not hide the optimizer state.
// Figures are logged at debug level every step, summarised at info level for every rank once
// (rank 0 prints them after step kSummaryStep), written to the event trace (trace_events) and
// compared with the usable memory the plan was made for (a warning, once per deployment, when
// a rank exceeds it).

#include <cstdint>
#include <string>

namespace autostage::staging {

class MemoryMeter {
 public:
  virtual ~MemoryMeter() = default;
  virtual std::string name() const = 0;  // e.g. "cpu allocator"
  virtual int64_t currentBytes() const = 0;
  virtual int64_t peakBytes() const = 0;
  // Starts a new peak window at the current usage.
  virtual void resetPeak() = 0;
};

}  // namespace autostage::staging
