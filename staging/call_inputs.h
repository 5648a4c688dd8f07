#pragma once
// The checks of a module call's inputs, and of how ranks call, made before any stage runs (Note
// [Bad input on one rank] in module.h): one rank's problem is raised on every rank.

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "comm/agreement.h"

namespace autostage::staging {

// The inputs as tensors; throws UnsupportedError naming the first that is not one.
std::vector<at::Tensor> tensorsOf(const std::vector<c10::IValue>& inputs);

// Every input must be a tensor with the batch in dim 0, all with the same number of rows.
void checkBatchDims(const std::vector<at::Tensor>& inputs);
// Every input must be on the CPU or a CUDA device (the module moves them to its stages' device).
void checkDevices(const std::vector<at::Tensor>& inputs);

// "(Float[8, 16], Long[8])"; with `batchAsB`, dim 0 is written as B.
std::string signatureOf(const std::vector<at::Tensor>& inputs, bool batchAsB);

// What the ranks exchange about their inputs: "<rows>\n<signature with B>\n<full signature>".
std::string inputSummary(const std::vector<at::Tensor>& inputs);

// Every rank must pass the same shapes and dtypes: from every rank's inputSummary, raises the
// same error on every rank (comm::throwAgreed) listing each rank's inputs when they differ.
void checkSameAcrossRanks(const std::vector<std::string>& summaries);

// Every rank must call the module alike (Note [Calls in different modes]): from every rank's
// description of its call, raises the same error on every rank when they differ.
void checkCalledAlike(const std::vector<std::string>& hows);

// The one exchange of a collective call of the module (a step, state_dict(), the optimizer's
// gathered state_dict): a `problem` found on any rank, `how` each rank calls (one line, as
// checkCalledAlike reads it) and a `payload` per rank, returned in rank order. Raises the same
// error on every rank when a rank had a problem or the ranks called differently, so a rank in
// another call than the others fails with the calls named instead of with their data.
std::vector<std::string> agreeOnHow(comm::Backend& backend, const std::string& step,
                                    const comm::StepStatus& problem, const std::string& how,
                                    const std::string& payload);

}  // namespace autostage::staging
