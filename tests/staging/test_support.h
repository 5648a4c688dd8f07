#pragma once
// Models, hand-built deployments and single-process references for the staging tests.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/script.h>

#include "comm/backend.h"
#include "core/deployment.h"
#include "core/ir/graph.h"

namespace autostage::staging::testing {

// A linear layer traced as TorchScript writes nn.Linear by hand: matmul(x, weight.t()) + bias
// (weight ~ 0.4 N(0,1), bias ~ 0.1 N(0,1)).
torch::jit::Module makeLinear(int64_t in, int64_t out);
// x[N,8] -> fc1(8,16) -> tanh -> fc2(16,16) -> relu -> fc3(16,4): returns [N,4].
torch::jit::Module makeMlp();
// forward(x, y) returns mse_loss(mlp(x), y) (mean over the batch): a model returning its loss.
torch::jit::Module makeLossMlp();
// The same weight (`shared`, 8x8) used by the first and the last layer (tied parameters).
torch::jit::Module makeTiedModel();
// forward(x, y) returns mean((tied(x)[:, :4] - y)^2): the tied model returning its loss.
torch::jit::Module makeTiedLossModel();

// A deployment of `graph` as consecutive node ranges: stage s holds the nodes
// [cut[s-1], cut[s]) (cut evenly by node count) and runs on `ranks[s]` (with `virtualStages` v,
// ranks[k] must equal ranks[k mod (stages / v)]). Routes are derived here
// from the graph independently of staging's code: every BATCH/LOSS value read outside its stage
// or returned, floating-point routes carry gradients.
core::Deployment makeDeployment(const core::Graph& graph,
                                const std::vector<std::vector<int>>& ranks, int worldSize,
                                int microBatchCount, const std::string& schedule = "gpipe",
                                const std::vector<bool>& recompute = {}, int virtualStages = 1);

// Gradients of the module's parameters by name (copies), then the gradients are reset.
std::map<std::string, at::Tensor> takeGradients(const torch::jit::Module& module);

// A shared_ptr that does not own `backend` (for ThreadBackend references in tests).
std::shared_ptr<comm::Backend> borrow(comm::Backend& backend);

// Rethrows the first exception of runThreadRanks, naming the rank.
void rethrowFirst(const std::vector<std::exception_ptr>& errors);

// Note [Assertions on thread ranks]
// Catch2 2.x is not thread-safe: CHECK or INFO on two thread ranks at once corrupts its state and
// can crash the run (a SIGSEGV in the api tests, once in a full run). Inside runThreadRanks with
// several ranks, assert with RANK_CHECK / RANK_CHECK_INFO / RANK_CHECK_THAT: the expression is
// evaluated first without a lock (it may be collective: a forward call), then reported under
// assertionMutex(). errorOf turns "throws X with message M" into a value to check.
std::mutex& assertionMutex();
// The message of what `f` throws; empty when it returns.
std::string errorOf(const std::function<void()>& f);
// Whether `f` throws an E.
template <class E>
bool throwsAs(const std::function<void()>& f) {
  try {
    f();
  } catch (const E&) {
    return true;
  } catch (...) {
  }
  return false;
}

#define RANK_CHECK_INFO(message, ...)                                                         \
  do {                                                                                        \
    const bool rankCheckOk_ = static_cast<bool>(__VA_ARGS__);                                 \
    std::lock_guard<std::mutex> rankCheckLock_(                                               \
        ::autostage::staging::testing::assertionMutex());                                     \
    INFO(#__VA_ARGS__ << "\n" << message);                                                    \
    CHECK(rankCheckOk_);                                                                      \
  } while (false)
#define RANK_CHECK(...) RANK_CHECK_INFO("", __VA_ARGS__)
#define RANK_CHECK_THAT(value, matcher)                                                       \
  do {                                                                                        \
    const auto rankCheckValue_ = (value);                                                     \
    std::lock_guard<std::mutex> rankCheckLock_(                                               \
        ::autostage::staging::testing::assertionMutex());                                     \
    CHECK_THAT(rankCheckValue_, matcher);                                                     \
  } while (false)

// max |a-b| / (atol + rtol |b|) <= 1, printed on failure by the caller.
bool allClose(const at::Tensor& a, const at::Tensor& b, double rtol = 1e-5, double atol = 1e-6);

}  // namespace autostage::staging::testing
