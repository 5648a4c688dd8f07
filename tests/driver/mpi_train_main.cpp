// mpirun test (4 ranks, real MPI): a few SGD steps of a wrapped MLP under a 2-stage x 2-replica
// gpipe deployment and of a loss-returning MLP under 1f1b, each compared with the same model
// trained in one process with plain PyTorch on the global batch. Prints one line per step and
// exits non-zero on any mismatch (on the rank that saw it; mpirun then fails the test).
#include <cstdio>

#include <torch/torch.h>

#include "driver/module.h"
#include "test_support.h"

namespace {

using namespace autostage;
constexpr int64_t kLocal = 6;
constexpr double kLearningRate = 0.1;

// A new model from `make` with seed `seed` (identical on every rank and for the reference;
// Module::deepcopy would make non-leaf parameter clones).
torch::jit::Module fresh(torch::jit::Module (*make)(), uint64_t seed) {
  torch::manual_seed(seed);
  return make();
}

void sgd(const std::vector<at::Tensor>& params) {
  torch::NoGradGuard noGrad;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) p.sub_(kLearningRate * p.grad());
    p.mutable_grad() = at::Tensor();
  }
}

std::vector<at::Tensor> paramsOf(const torch::jit::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p);
  return out;
}

int checkParams(const driver::Module& module, const torch::jit::Module& ref, int rank) {
  int bad = 0;
  std::map<std::string, at::Tensor> want;
  for (const auto& p : ref.named_parameters(true)) want[p.name] = p.value;
  for (const auto& [name, t] : module.namedParameters()) {
    if (staging::testing::allClose(t.detach(), want.at(name).detach())) continue;
    std::printf("rank %d: parameter %s differs from the single-process run\n", rank, name.c_str());
    ++bad;
  }
  return bad;
}

// Caller-side loss on each rank's rows, gpipe, 2 stages x 2 replicas, 2 micro-batches.
int trainOutputModel(int steps) {
  torch::jit::Module ref = fresh(staging::testing::makeMlp, 21);
  driver::ModuleOptions options;
  options.planner = [](const driver::PlanningInput& in) {
    return staging::testing::makeDeployment(in.model.graph, {{0, 1}, {2, 3}}, in.worldSize, 2);
  };
  driver::Module module(fresh(staging::testing::makeMlp, 21), options);
  int rank = module.rank(), world = module.worldSize(), bad = 0;
  for (int step = 0; step < steps; ++step) {
    at::Tensor x = torch::randn({world * kLocal, 8}), y = torch::randn({world * kLocal, 4});
    at::Tensor refOut = ref.forward({x}).toTensor();
    at::Tensor refLoss = (refOut - y).pow(2).mean();
    refLoss.backward();
    sgd(paramsOf(ref));
    at::Tensor out = module.forward({x.narrow(0, rank * kLocal, kLocal)})[0];
    at::Tensor loss = (out - y.narrow(0, rank * kLocal, kLocal)).pow(2).mean();
    loss.backward();
    sgd(module.parameters());
    at::Tensor want = (refOut.narrow(0, rank * kLocal, kLocal) - y.narrow(0, rank * kLocal, kLocal))
                          .pow(2).mean();
    bool ok = staging::testing::allClose(loss.detach(), want.detach());
    std::printf("rank %d gpipe step %d: local loss %.7f, single-process %.7f %s\n", rank, step,
                loss.item<double>(), want.item<double>(), ok ? "ok" : "MISMATCH");
    bad += ok ? 0 : 1;
  }
  return bad + checkParams(module, ref, rank);
}

// Loss-returning model, 1f1b trainStep, 3 stages with replicas {2,1,1}, 3 micro-batches.
int trainLossModel(int steps) {
  torch::jit::Module ref = fresh(staging::testing::makeLossMlp, 22);
  driver::ModuleOptions options;
  options.planner = [](const driver::PlanningInput& in) {
    return staging::testing::makeDeployment(in.model.graph, {{0, 1}, {2}, {3}}, in.worldSize, 3,
                                            "1f1b");
  };
  driver::Module module(fresh(staging::testing::makeLossMlp, 22), options);
  int rank = module.rank(), world = module.worldSize(), bad = 0;
  for (int step = 0; step < steps; ++step) {
    at::Tensor x = torch::randn({world * kLocal, 8}), y = torch::randn({world * kLocal, 4});
    at::Tensor refLoss = ref.forward({x, y}).toTensor();
    refLoss.backward();
    sgd(paramsOf(ref));
    at::Tensor loss = module.trainStep({x.narrow(0, rank * kLocal, kLocal),
                                        y.narrow(0, rank * kLocal, kLocal)})[0];
    sgd(module.parameters());
    bool ok = staging::testing::allClose(loss, refLoss.detach());
    std::printf("rank %d 1f1b step %d: loss %.7f, single-process %.7f %s\n", rank, step,
                loss.item<double>(), refLoss.item<double>(), ok ? "ok" : "MISMATCH");
    bad += ok ? 0 : 1;
  }
  return bad + checkParams(module, ref, rank);
}

}  // namespace

int main() {
  at::set_num_threads(1);
  try {
    int bad = trainOutputModel(3) + trainLossModel(3);
    std::fflush(stdout);
    return bad == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
