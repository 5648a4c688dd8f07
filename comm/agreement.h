#pragma once
// Collective error agreement: a step that may fail on some ranks only (bad input on one rank,
// planning on rank 0, a file missing on one node) is followed by a status exchange, so that every
// rank either proceeds or throws the same error. Without it, the ranks that succeeded would block
// in the next collective until comm_timeout_s and report a misleading CommError.
//
//   comm::runAgreed(backend, "loading the deployment", [&] { d = loadDeployment(path); });
//
// Note [Agreed errors]
// The error thrown by an agreement has the class of the lowest failing rank's error and a message
// naming every failing rank with its own message (ranks with identical messages are merged):
//   "rank 2: input 0 is a 0-dim tensor ..."  or  "ranks 0,1,2,3: the model ...".
// The message is remembered (lastAgreedError()) so the Python exception hook can tell an error
// every rank raised (the job can end normally) from one raised on a single rank (abort the job).

#include <functional>
#include <string>
#include <vector>

#include "comm/backend.h"

namespace autostage::comm {

// One rank's outcome of a step: errorClass empty means success. errorClass is the autostage
// class name ("Error", "ConfigError", "FormatError", "UnsupportedError", "PlanError",
// "CommError", "InternalError"); other names are treated as "Error".
struct StepStatus {
  std::string errorClass;
  std::string message;
  bool ok() const { return errorClass.empty(); }
  // Classifies the exception currently being handled (call inside a catch block).
  static StepStatus fromCurrentException();
};

// Collective over the world: exchanges every rank's status; returns when all succeeded, otherwise
// throws the agreed error (Note [Agreed errors]) on every rank. `step` names what was attempted.
void agreeOnStatus(Backend& backend, const std::string& step, const StepStatus& local);

// Like agreeOnStatus, and in the same exchange gathers every rank's `payload` (returned in rank
// order when all succeeded): one collective for "is anything wrong, and what did each rank see".
std::vector<std::string> agreeAndGather(Backend& backend, const std::string& step,
                                        const StepStatus& local, const std::string& payload);

// Throws an error that every rank raises identically from the same gathered data (no
// communication); remembered like an agreed error.
[[noreturn]] void throwAgreed(const std::string& errorClass, const std::string& message);

// Runs `body` on this rank, then agrees on the outcome (collective over the world).
void runAgreed(Backend& backend, const std::string& step, const std::function<void()>& body);

// Throws the autostage error class named `errorClass` with `message`.
[[noreturn]] void throwErrorOfClass(const std::string& errorClass, const std::string& message);

// Message of the last error this process threw through agreeOnStatus ("" if none).
std::string lastAgreedError();

}  // namespace autostage::comm
