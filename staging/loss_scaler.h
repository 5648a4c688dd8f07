#pragma once
// Dynamic loss scaling for fp16 training (Note [Dynamic loss scaling]). Torch-free state; the
// gradients it concerns are scaled by Executor::trainStep (or the caller's own loss * scale()) and
// unscaled and checked by Executor::unscaleGradients.

#include <cstdint>
#include <string>

namespace autostage::staging {

// Note [Dynamic loss scaling]
// fp16 gradients underflow to zero for small values, so the loss is multiplied by a scale before
// backward and every gradient divided by it before the optimizer steps, as
// torch.cuda.amp.GradScaler does, with its defaults and rules: after a step whose gradients hold
// an inf or NaN the step is skipped and the scale multiplied by backoffFactor; after
// growthInterval finite steps in a row it is multiplied by growthFactor. Whether a step's
// gradients are finite is decided once for the whole model: a rank sees only its stages'
// gradients, so Executor::unscaleGradients computes the global gradient norm (every parameter
// counted once over stages, replicas and ZeRO-1 pieces: Note [Global gradient norm]) and every
// rank reads the same verdict from it -- all ranks skip the same steps and keep the same scale.
// The losses a trainStep returns are never scaled.
struct LossScalerOptions {
  double initScale = 65536.0;  // 2^16
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
  // Throws ConfigError naming the value that is out of range.
  void validate() const;
};

// Throws ConfigError "<what>: the loss scale must be a positive finite number, got <scale>"
// unless it is one.
void checkLossScale(double scale, const std::string& what);

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});
  // What to multiply the loss by (the gradient the backward starts from).
  double scale() const { return scale_; }
  // Finite steps in a row since the scale last changed.
  int64_t growthTracker() const { return tracker_; }
  const LossScalerOptions& options() const { return options_; }
  // After a step: `finite` is the agreed verdict on its gradients (the step ran) or false (it was
  // skipped). Returns the new scale.
  double update(bool finite);
  // Replaces the scale (GradScaler.update(new_scale)) and restarts growth tracking.
  void setScale(double scale);
  // Restores a saved state (scale and tracker); throws ConfigError for values out of range.
  void load(double scale, int64_t tracker);
  // "scale 65536 (growth x2 after 2000 finite steps, backoff x0.5; 12 finite in a row)".
  std::string toString() const;

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t tracker_ = 0;
};

}  // namespace autostage::staging
