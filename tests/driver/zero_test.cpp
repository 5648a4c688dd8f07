// ZeRO-1 on 4 thread ranks (Note [ZeRO-1] in staging/gradient_sync.h): after backward each
// replica holds the summed gradient of exactly the pieces it owns (zeros elsewhere), the pieces of
// a stage's replicas cover every element once, the global norm counts each element once, and an
// SGD step on the pieces followed by gatherParams gives every replica the plain step's
// parameters, and gatherGrads gives every replica the whole plain gradient (RaNNC's
// _sync_orig_params(sync_grad=True)). Results are collected per rank and asserted on the main
// thread.
#include <torch/torch.h>

#include "catch_torch.h"

#include "comm/thread_backend.h"
#include "driver/module.h"
#include "test_support.h"

namespace autostage::driver {
namespace {

using namespace staging;

using testing::allClose;

constexpr int kWorld = 4;
constexpr int64_t kLocal = 4;
constexpr double kLr = 0.1;

struct ZeroResult {
  std::map<std::string, at::Tensor> grads, params, gathered;
  std::map<std::string, at::Tensor> owned;  // 1 where this rank owns the element
  double norm = 0;
  bool sharded = false;
};

void runZeroCase(const std::function<torch::jit::Module()>& make,
                 const std::vector<std::vector<int>>& ranks) {
  torch::manual_seed(300);
  torch::jit::Module ref = make();
  at::Tensor x = torch::randn({kWorld * kLocal, 8});
  at::Tensor refOut = ref.forward({x}).toTensor();
  at::Tensor y = torch::randn_like(refOut);
  (refOut - y).pow(2).mean().backward();
  std::map<std::string, at::Tensor> refGrads = testing::takeGradients(ref);
  double refNorm = 0;
  for (const auto& [name, g] : refGrads) refNorm += g.pow(2).sum().item<double>();
  refNorm = std::sqrt(refNorm);
  std::map<std::string, at::Tensor> refParams;
  for (const auto& p : ref.named_parameters()) refParams[p.name] = p.value.detach().clone();

  std::vector<torch::jit::Module> copies;
  for (int r = 0; r < kWorld; ++r) torch::manual_seed(300), copies.push_back(make());
  std::vector<ZeroResult> results(kWorld);
  testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& backend) {
    const int rank = backend.rank();
    ModuleOptions options;
    options.backend = testing::borrow(backend);
    options.gradientBucketBytes = 300;  // several buckets, pieces cut inside parameters
    options.planner = [&](const PlanningInput& in) {
      core::Deployment d = testing::makeDeployment(in.model.graph, ranks, in.worldSize, 2);
      for (core::StageDeployment& s : d.stages) s.zero = s.replicaCount() > 1;
      return d;
    };
    Module module(copies[rank], options);
    at::Tensor out = module.forward({x.narrow(0, rank * kLocal, kLocal)})[0];
    (out - y.narrow(0, rank * kLocal, kLocal)).pow(2).mean().backward();
    Executor& executor = module.trainingExecutor();
    ZeroResult& result = results[rank];
    for (const auto& [name, t] : module.namedParameters()) {
      result.grads[name] = t.grad().clone();
      result.owned[name] = at::zeros({t.numel()});
    }
    std::vector<ShardPiece> pieces = executor.zeroShards();
    result.sharded = !pieces.empty();
    {
      at::NoGradGuard noGrad;
      for (const ShardPiece& piece : pieces) {
        const at::Tensor& p = executor.params().tensor(piece.param);
        const std::string& name = executor.params().name(piece.param);
        result.owned[name].narrow(0, piece.offset, piece.length).fill_(1);
        // An SGD step on the owned piece only.
        p.view(-1)
            .narrow(0, piece.offset, piece.length)
            .sub_(kLr * p.grad().view(-1).narrow(0, piece.offset, piece.length));
      }
    }
    result.norm = executor.clipGradNorm(1e9);  // large: measures only
    executor.gatherParams();
    executor.gatherGrads();
    for (const auto& [name, t] : module.namedParameters()) result.gathered[name] = t.grad().clone();
    for (const auto& [name, t] : module.namedParameters()) result.params[name] = t.detach().clone();
  }));
  for (const auto& [name, grad] : refGrads) {
    INFO("parameter " << name);
    at::Tensor cover = at::zeros({grad.numel()});
    for (int r = 0; r < kWorld; ++r) {
      INFO("rank " << r);
      const ZeroResult& result = results[r];
      if (!result.grads.count(name)) continue;
      REQUIRE(result.sharded);
      cover += result.owned.at(name);
      // Owned elements: the plain gradient; the rest of a sharded .grad: zero.
      at::Tensor mask = result.owned.at(name).view(grad.sizes());
      CHECK(allClose(result.grads.at(name) * mask, grad * mask));
      CHECK(result.grads.at(name).mul(1 - mask).abs().max().item<double>() == 0);
      CHECK(allClose(result.params.at(name), refParams.at(name) - kLr * grad));
      CHECK(allClose(result.gathered.at(name), grad));
      CHECK(std::abs(result.norm - refNorm) <= 1e-5 * refNorm);
    }
    // Each element is owned by exactly one rank of the parameter's holder set.
    CHECK(at::equal(cover, at::ones({grad.numel()})));
  }
}

TEST_CASE("ZeRO-1: owned gradient pieces, global norm, gathered parameters and gradients equal "
          "plain PyTorch",
          "[staging]") {
  at::set_num_threads(1);
  runZeroCase(testing::makeMlp, {{0, 1}, {2, 3}});  // 2 stages x 2 replicas
  runZeroCase(testing::makeMlp, {{0, 1, 2, 3}});    // one stage on 4 replicas
  // Tied weight in two stages: its holder set {0,1,2,3} is sharded over all four.
  runZeroCase(testing::makeTiedModel, {{0, 1}, {2, 3}});
}

}  // namespace
}  // namespace autostage::driver
