// Multi-rank equivalence tests: 4 in-process ranks (thread backend) run a wrapped module under
// hand-built deployments; every rank's outputs and every parameter gradient must equal a plain
// single-process PyTorch run on the global batch (the concatenation of the ranks' batches).
//
// Tolerance rtol 1e-5 / atol 1e-6 rather than bit equality: micro-batching splits matmuls into
// row blocks and the gradient of a parameter is summed over micro-batches and replicas in a
// different order than the single full-batch backward, so float32 rounding differs slightly.
#include <atomic>
#include <functional>

#include "catch_torch.h"
#include <torch/torch.h>

#include "comm/thread_backend.h"
#include "core/error.h"
#include "driver/module.h"
#include "test_support.h"

namespace autostage::driver {
namespace {

using namespace staging;

using testing::allClose;
using testing::borrow;
using testing::makeDeployment;

constexpr int kWorld = 4;
constexpr int64_t kLocal = 4;

struct RankResult {
  std::vector<at::Tensor> outputs;
  std::map<std::string, at::Tensor> grads;
  std::map<std::string, at::Tensor> params;
};

struct Case {
  std::vector<std::vector<int>> ranks;  // per stage
  int microBatches = 1;
  std::vector<bool> recompute = {};
  std::string schedule = "gpipe";
  int virtualStages = 1;  // Note [Pipeline schedules]: ranks[k] == ranks[k mod (stages / v)]
};

std::string describe(const Case& c) {
  std::ostringstream out;
  for (const auto& r : c.ranks) out << r.size() << "x ";
  out << "stages, " << c.microBatches << " micro-batches, " << c.schedule << " v="
      << c.virtualStages;
  for (bool r : c.recompute) out << (r ? " R" : " -");
  return out.str();
}

using Factory = std::function<torch::jit::Module()>;

// A fresh model from `make` with seed `seed`. (Not Module::deepcopy: its tensor copies are
// clones recorded by autograd, i.e. non-leaf parameters that never receive a .grad.)
torch::jit::Module build(const Factory& make, uint64_t seed) {
  torch::manual_seed(seed);
  return make();
}

// Identical models, one per rank; ranks > 0 get perturbed parameters so that equal results also
// prove the parameters were synchronised from rank 0.
std::vector<torch::jit::Module> rankCopies(const Factory& make, uint64_t seed) {
  std::vector<torch::jit::Module> copies;
  for (int r = 0; r < kWorld; ++r) {
    copies.push_back(build(make, seed));
    torch::NoGradGuard noGrad;
    if (r > 0)
      for (const auto& p : copies.back().parameters()) p.add_(0.5 * r);
  }
  return copies;
}

ModuleOptions optionsFor(comm::Backend& backend, const Case& c, std::atomic<int>* planCalls) {
  ModuleOptions options;
  options.backend = borrow(backend);
  options.gradientBucketBytes = 600;  // several buckets even for these small models
  options.planner = [c, planCalls](const PlanningInput& in) {
    ++*planCalls;
    return makeDeployment(in.model.graph, c.ranks, in.worldSize, c.microBatches, c.schedule,
                          c.recompute, c.virtualStages);
  };
  return options;
}

void collect(const Module& module, RankResult* result) {
  for (const auto& [name, t] : module.namedParameters()) {
    result->grads[name] = t.grad().defined() ? t.grad().clone() : at::zeros_like(t);
    result->params[name] = t.detach().clone();
  }
}

void checkAgainst(const std::vector<RankResult>& results, const at::Tensor& expectedOut,
                  bool perRankRows, const std::map<std::string, at::Tensor>& expectedGrads) {
  std::set<std::string> seen;
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    at::Tensor want = perRankRows ? expectedOut.narrow(0, r * kLocal, kLocal) : expectedOut;
    REQUIRE(results[r].outputs.size() == 1);
    CHECK(allClose(results[r].outputs[0], want));
    for (const auto& [name, grad] : results[r].grads) {
      CHECK(expectedGrads.at(name).abs().sum().item<double>() > 0);  // a real gradient
      INFO("gradient of " << name << "\n got " << grad << "\n want " << expectedGrads.at(name));
      CHECK(allClose(grad, expectedGrads.at(name)));
      seen.insert(name);
    }
  }
  CHECK(seen.size() == expectedGrads.size());  // every parameter is held by some rank
}

// Caller computes mean((out - y)^2) on its local rows and calls backward.
void runOutputCase(const Factory& make, const Case& c) {
  INFO(describe(c));
  torch::jit::Module ref = build(make, 100);
  at::Tensor x = torch::randn({kWorld * kLocal, 8});
  at::Tensor refOut = ref.forward({x}).toTensor();
  at::Tensor y = torch::randn_like(refOut);
  (refOut - y).pow(2).mean().backward();
  auto refGrads = testing::takeGradients(ref);

  std::vector<torch::jit::Module> copies = rankCopies(make, 100);
  std::vector<RankResult> results(kWorld);
  std::atomic<int> planCalls{0};
  testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& backend) {
    int rank = backend.rank();
    Module module(copies[rank], optionsFor(backend, c, &planCalls));
    at::Tensor out = module.forward({x.narrow(0, rank * kLocal, kLocal)})[0];
    (out - y.narrow(0, rank * kLocal, kLocal)).pow(2).mean().backward();
    results[rank].outputs = {out.detach().clone()};
    collect(module, &results[rank]);
  }));
  CHECK(planCalls == 1);  // rank 0 plans, the others receive its deployment
  checkAgainst(results, refOut.detach(), true, refGrads);
}

// The model returns its loss; ranks run trainStep (1f1b) or forward + loss.backward() (gpipe).
void runLossCase(const Case& c, const Factory& make = testing::makeLossMlp) {
  INFO(describe(c));
  torch::jit::Module ref = build(make, 200);
  at::Tensor x = torch::randn({kWorld * kLocal, 8});
  at::Tensor y = torch::randn({kWorld * kLocal, 4});
  at::Tensor refLoss = ref.forward({x, y}).toTensor();
  refLoss.backward();
  auto refGrads = testing::takeGradients(ref);

  std::vector<torch::jit::Module> copies = rankCopies(make, 200);
  std::vector<RankResult> results(kWorld);
  std::atomic<int> planCalls{0};
  testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& backend) {
    int rank = backend.rank();
    Module module(copies[rank], optionsFor(backend, c, &planCalls));
    std::vector<c10::IValue> batch{x.narrow(0, rank * kLocal, kLocal),
                                   y.narrow(0, rank * kLocal, kLocal)};
    at::Tensor loss;
    if (c.schedule == "1f1b") {
      loss = module.trainStep(batch)[0];
    } else {
      loss = module.forward(batch)[0];
      loss.backward();
    }
    results[rank].outputs = {loss.detach().clone()};
    collect(module, &results[rank]);
  }));
  checkAgainst(results, refLoss.detach(), false, refGrads);
}

TEST_CASE("MLP under gpipe: outputs and gradients equal single-process PyTorch", "[staging]") {
  at::set_num_threads(1);
  Factory mlp = testing::makeMlp;
  for (int micro : {1, 2, 4}) {
    runOutputCase(mlp, {{{0, 1}, {2, 3}}, micro});  // 2 stages x 2 replicas
    runOutputCase(mlp, {{{0, 1, 2, 3}}, micro});    // pure data parallel
    runOutputCase(mlp, {{{0, 1}, {2}, {3}}, micro}); // 3 stages, replicas {2,1,1}
  }
  runOutputCase(mlp, {{{3}, {1, 2}, {0}}, 2});      // replica ranks in any order
  runOutputCase(mlp, {{{0}, {1}, {2}, {3}}, 4});    // 4 stages, no replication
}

TEST_CASE("recompute stages give the same outputs and gradients", "[staging]") {
  at::set_num_threads(1);
  Factory mlp = testing::makeMlp;
  runOutputCase(mlp, {{{0, 1}, {2, 3}}, 2, {true, false}});
  runOutputCase(mlp, {{{0, 1}, {2}, {3}}, 4, {true, true, true}});
}

TEST_CASE("tied parameters in two stages get the summed gradient", "[staging]") {
  at::set_num_threads(1);
  Factory tied = testing::makeTiedModel;
  runOutputCase(tied, {{{0, 1}, {2}, {3}}, 2});
  runOutputCase(tied, {{{0}, {1, 2, 3}}, 1});
}

TEST_CASE("a model returning its loss: 1f1b trainStep and gpipe match the global mean loss",
          "[staging]") {
  at::set_num_threads(1);
  for (int micro : {1, 2, 4}) {
    runLossCase({{{0, 1}, {2}, {3}}, micro, {}, "1f1b"});
    runLossCase({{{0, 1}, {2}, {3}}, micro, {}, "gpipe"});
  }
  runLossCase({{{0}, {1}, {2}, {3}}, 4, {false, true, false, true}, "1f1b"});
  runLossCase({{{0, 1, 2, 3}}, 2, {}, "1f1b"});
}

TEST_CASE("interleaved 1f1b (virtual stages): losses and gradients equal single-process PyTorch",
          "[staging]") {
  at::set_num_threads(1);
  // 2 positions x 2 virtual stages, replicated and not; M a multiple of the positions.
  for (int micro : {2, 4}) {
    runLossCase({{{0, 1}, {2, 3}, {0, 1}, {2, 3}}, micro, {}, "1f1b", 2});
    runLossCase({{{0}, {1}, {0}, {1}}, micro, {}, "1f1b", 2});  // ranks 2, 3 only feed
  }
  // 3 positions of replicas {1, 1, 2}, recompute on some virtual stages.
  runLossCase({{{0}, {1}, {2, 3}, {0}, {1}, {2, 3}}, 3, {true, false, false, false, true, true},
               "1f1b", 2});
  // 2 positions x 4 virtual stages.
  runLossCase({{{0, 1}, {2, 3}, {0, 1}, {2, 3}, {0, 1}, {2, 3}, {0, 1}, {2, 3}}, 2, {}, "1f1b", 4});
  // Tied parameters: the first and the last use of `shared`, in every layout.
  runLossCase({{{0, 1}, {2, 3}, {0, 1}, {2, 3}}, 2, {}, "1f1b", 2}, testing::makeTiedLossModel);
  runLossCase({{{0}, {1}, {2}, {0}, {1}, {2}}, 3, {}, "1f1b", 2}, testing::makeTiedLossModel);
}

TEST_CASE("different local batch sizes fail on every rank, naming ranks and sizes", "[staging]") {
  at::set_num_threads(1);
  std::vector<torch::jit::Module> copies = rankCopies(testing::makeMlp, 1);
  std::atomic<int> planCalls{0};
  Case c{{{0, 1}, {2, 3}}, 1};
  auto errors = comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& backend) {
    Module module(copies[backend.rank()], optionsFor(backend, c, &planCalls));
    module.forward({torch::randn({backend.rank() == 3 ? 3 : 4, 8})});
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r]);
    CHECK_THROWS_WITH(std::rethrow_exception(errors[r]),
                      Catch::Contains("different local batch sizes") &&
                          Catch::Contains("rank 3: 3") && Catch::Contains("rank 0: 4"));
  }
}

TEST_CASE("a failing planner on rank 0 becomes a PlanError on every rank", "[staging]") {
  std::vector<torch::jit::Module> copies = rankCopies(testing::makeMlp, 1);
  auto errors = comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& backend) {
    ModuleOptions options;
    options.backend = borrow(backend);
    options.planner = [](const PlanningInput&) -> core::Deployment {
      throw PlanError("no feasible plan within 1 byte");
    };
    Module module(copies[backend.rank()], options);
    module.forward({torch::randn({4, 8})});
  });
  for (int r = 0; r < kWorld; ++r) {
    REQUIRE(errors[r]);
    CHECK_THROWS_AS(std::rethrow_exception(errors[r]), PlanError);
    CHECK_THROWS_WITH(std::rethrow_exception(errors[r]), Catch::Contains("no feasible plan"));
  }
}

}  // namespace
}  // namespace autostage::driver
