#include "staging/loss_scaler.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace autostage::staging {

void LossScalerOptions::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError, std::isfinite(initScale) && initScale > 0,
                     "loss scaling: init_scale must be a positive finite number, got ", initScale);
  AUTOSTAGE_CHECK_AS(ConfigError, std::isfinite(growthFactor) && growthFactor > 1,
                     "loss scaling: growth_factor must be > 1, got ", growthFactor);
  AUTOSTAGE_CHECK_AS(ConfigError, backoffFactor > 0 && backoffFactor < 1,
                     "loss scaling: backoff_factor must be in (0, 1), got ", backoffFactor);
  AUTOSTAGE_CHECK_AS(ConfigError, growthInterval >= 1,
                     "loss scaling: growth_interval must be >= 1, got ", growthInterval);
}

void checkLossScale(double scale, const std::string& what) {
  AUTOSTAGE_CHECK_AS(ConfigError, std::isfinite(scale) && scale > 0, what,
                     ": the loss scale must be a positive finite number, got ", scale);
}

LossScaler::LossScaler(LossScalerOptions options)
    : options_(options), scale_(options.initScale) {
  options_.validate();
}

double LossScaler::update(bool finite) {
  if (!finite) {
    scale_ *= options_.backoffFactor;
    tracker_ = 0;
  } else if (++tracker_ >= options_.growthInterval) {
    // Growth stops where fp32 itself overflows (torch's scale is an fp32 tensor).
    if (std::isfinite(static_cast<float>(scale_ * options_.growthFactor)))
      scale_ *= options_.growthFactor;
    tracker_ = 0;
  }
  return scale_;
}

void LossScaler::setScale(double scale) { load(scale, 0); }

void LossScaler::load(double scale, int64_t tracker) {
  checkLossScale(scale, "loss scaling");
  AUTOSTAGE_CHECK_AS(ConfigError, tracker >= 0 && tracker < options_.growthInterval,
                     "loss scaling: the growth tracker must be in [0, growth_interval=",
                     options_.growthInterval, "), got ", tracker);
  scale_ = scale;
  tracker_ = tracker;
}

std::string LossScaler::toString() const {
  std::ostringstream out;
  out << "scale " << scale_ << " (growth x" << options_.growthFactor << " after "
      << options_.growthInterval << " finite steps, backoff x" << options_.backoffFactor << "; "
      << tracker_ << " finite in a row)";
  return out.str();
}

}  // namespace autostage::staging
