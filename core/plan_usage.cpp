#include "core/plan_usage.h"

#include "core/error.h"

namespace autostage::core {

std::string usageName(PlanUsage usage) {
  switch (usage) {
    case PlanUsage::ForwardBackward: return "forward_backward";
    case PlanUsage::TrainStep: return "train_step";
    case PlanUsage::Inference: return "inference";
  }
  return "?";
}

PlanUsage parseUsage(const std::string& text) {
  for (PlanUsage u : {PlanUsage::ForwardBackward, PlanUsage::TrainStep, PlanUsage::Inference})
    if (text == usageName(u)) return u;
  throw ConfigError("plan usage '" + text +
                    "' is unknown; use forward_backward, train_step or inference");
}

std::string recordedUsage(const Deployment& deployment) {
  auto found = deployment.options.find(kUsageOption);
  return found == deployment.options.end() ? "" : found->second;
}

}  // namespace autostage::core
