#pragma once
// One rank's step-by-step memory measurement against its stage's prediction (Note [Measured
// memory] in staging/memory_meter.h). Owned by the Executor; inactive without a meter.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "comm/backend.h"
#include "core/deployment.h"
#include "staging/memory_meter.h"
#include "staging/param_storage.h"
#include "staging/step_memory.h"

namespace autostage::staging {

class MemoryWatch {
 public:
  // The step after which rank 0 prints every rank's figures (the optimizer state exists from
  // the second step on).
  static constexpr long kSummaryStep = 3;

  // `stages` are this rank's stages in `deployment` (none, one, or one per virtual stage: their
  // predictions add up, Note [Interleaved memory] in decomposer/simulator.h). A null meter:
  // inactive.
  MemoryWatch(std::shared_ptr<MemoryMeter> meter, const core::Deployment& deployment,
              const std::vector<int>& stages);
  bool active() const { return meter_ != nullptr; }
  bool open() const { return open_; }
  // Opens a step window (a window left open, e.g. a forward never followed by backward, is
  // dropped).
  void begin(const ParamStorage& params);
  // Closes the window and logs it; returns its figures (nullopt when none was open).
  // Collective over `backend`'s world at step kSummaryStep (rank 0 prints every rank's line).
  std::optional<StepMemory> end(const ParamStorage& params, comm::Backend& backend);
  // Bytes of the optimizer state of this rank's parameters, as the caller's optimizer holds it
  // now (< 0: unknown; the meter's resident bytes stand in for it).
  void setOptimizerBytes(int64_t bytes) { optimizerBytes_ = bytes; }
  // The last closed step's figures (nullopt before the first).
  const std::optional<StepMemory>& last() const { return last_; }

 private:
  void summarize(const StepMemory& memory, comm::Backend& backend) const;

  std::shared_ptr<MemoryMeter> meter_;
  int stage_;
  int64_t predicted_ = 0, usable_ = 0;
  bool open_ = false, warned_ = false;
  long steps_ = 0;
  int64_t startCurrent_ = 0, startGradients_ = 0, optimizerBytes_ = -1;
  std::optional<StepMemory> last_;
};

}  // namespace autostage::staging
