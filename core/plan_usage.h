#pragma once
// How a plan will be run (Note [Plan usage]): chosen by the API call that needs the plan, passed
// to the planner, recorded in the deployment's options (usage=...) and checked by the runtime.
//
// Note [Plan usage]
// How the plan will be run decides which schedules it may use and what it must hold, so the plan
// is made for one usage and the runtime runs exactly the schedule the plan records:
//   forward_backward  out = model(x); loss.backward(): every micro-batch's forward runs before
//                     any backward, so only gpipe can run (it holds every micro-batch's
//                     activations until the backward).
//   train_step        model.train_step(x): forward and backward in one call; every schedule.
//   inference         a forward under no_grad: no gradients, no optimizer state, no activations
//                     kept for a backward; forward only (gpipe order, no backward, no allreduce).
// A module keeps one deployment per usage (driver/module.h), made on the first call of that
// usage and reused after.

#include <string>

#include "core/deployment.h"

namespace autostage::core {

enum class PlanUsage { ForwardBackward, TrainStep, Inference };

std::string usageName(PlanUsage usage);  // "forward_backward", "train_step", "inference"
// Parses a usageName; throws ConfigError naming the bad text and the valid ones.
PlanUsage parseUsage(const std::string& text);
// The key of Deployment::options that records the usage.
inline constexpr const char* kUsageOption = "usage";
// The usage `deployment` records ("" in files written before it was recorded).
std::string recordedUsage(const Deployment& deployment);

}  // namespace autostage::core
