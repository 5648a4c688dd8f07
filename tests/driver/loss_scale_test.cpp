// Dynamic loss scaling (Note [Dynamic loss scaling] in staging/loss_scaler.h): the scaler's rules
// against GradScaler's, and on 4 thread ranks a scaled trainStep's gradients against the plain
// ones, unscaling, and one rank's overflow becoming every rank's verdict.
#include <cfloat>
#include <cmath>

#include <torch/torch.h>

#include "catch_torch.h"

#include "comm/thread_backend.h"
#include "core/error.h"
#include "driver/module.h"
#include "staging/loss_scaler.h"
#include "test_support.h"

namespace autostage::driver {
namespace {

using namespace staging;
using staging::LossScaler;
using staging::LossScalerOptions;

TEST_CASE("loss scaler: back off on overflow, grow after growth_interval finite steps",
          "[staging]") {
  LossScaler defaults;
  CHECK(defaults.scale() == 65536.0);
  CHECK(defaults.options().growthInterval == 2000);

  LossScaler scaler({1024, 2, 0.5, 3});
  CHECK(scaler.update(true) == 1024);
  CHECK(scaler.update(true) == 1024);
  CHECK(scaler.growthTracker() == 2);
  CHECK(scaler.update(false) == 512);  // an overflow restarts the count
  CHECK(scaler.growthTracker() == 0);
  CHECK(scaler.update(true) == 512);
  CHECK(scaler.update(true) == 512);
  CHECK(scaler.update(true) == 1024);  // the third finite step in a row
  CHECK(scaler.growthTracker() == 0);
  CHECK(scaler.update(false) == 512);
  CHECK(scaler.update(false) == 256);
  CHECK(scaler.toString() == "scale 256 (growth x2 after 3 finite steps, backoff x0.5; 0 finite "
                             "in a row)");
  // Growth stops where the scale would overflow fp32.
  LossScaler top({FLT_MAX / 1.5, 2, 0.5, 1});
  CHECK(top.update(true) == Approx(FLT_MAX / 1.5));
  scaler.load(8, 2);
  CHECK(scaler.scale() == 8);
  CHECK(scaler.update(true) == 16);
  scaler.setScale(3);
  CHECK(scaler.growthTracker() == 0);

  using Catch::Contains;
  CHECK_THROWS_AS(LossScaler({0, 2, 0.5, 10}), ConfigError);
  CHECK_THROWS_WITH(LossScaler({NAN, 2, 0.5, 10}), Contains("init_scale"));
  CHECK_THROWS_WITH(LossScaler({1, 1, 0.5, 10}), Contains("growth_factor must be > 1"));
  CHECK_THROWS_WITH(LossScaler({1, 2, 1.5, 10}), Contains("backoff_factor must be in (0, 1)"));
  CHECK_THROWS_WITH(LossScaler({1, 2, 0.5, 0}), Contains("growth_interval must be >= 1"));
  CHECK_THROWS_WITH(scaler.load(INFINITY, 0), Contains("positive finite"));
  CHECK_THROWS_WITH(scaler.load(4, 3), Contains("growth tracker must be in [0, growth_interval=3)"));
}

constexpr int kWorld = 4;
constexpr int64_t kLocal = 4;
constexpr double kScale = 1024;

struct ScaledResult {
  double loss = 0, scaledLoss = 0;
  std::map<std::string, at::Tensor> plainGrads, scaledGrads, unscaledGrads;
  double plainNorm = 0, unscaledNorm = 0, overflowNorm = 0;
};

TEST_CASE("a scaled trainStep: gradients times the scale, losses unscaled - unscaling restores "
          "them and one rank's inf is every rank's verdict", "[staging]") {
  at::set_num_threads(1);
  torch::manual_seed(41);
  at::Tensor x = torch::randn({kWorld * kLocal, 8});
  at::Tensor y = torch::randn({kWorld * kLocal, 4});
  std::vector<torch::jit::Module> copies;
  for (int r = 0; r < kWorld; ++r) {
    torch::manual_seed(7);
    copies.push_back(testing::makeLossMlp());
  }
  std::vector<ScaledResult> results(kWorld);
  testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& backend) {
    const int rank = backend.rank();
    ModuleOptions options;
    options.backend = testing::borrow(backend);
    options.planner = [](const PlanningInput& in) {  // 2 stages x 2 replicas, 1f1b
      return testing::makeDeployment(in.model.graph, {{0, 1}, {2, 3}}, in.worldSize, 2, "1f1b");
    };
    Module module(copies[rank], options);
    std::vector<c10::IValue> batch{x.narrow(0, rank * kLocal, kLocal),
                                   y.narrow(0, rank * kLocal, kLocal)};
    ScaledResult& result = results[rank];
    auto grads = [&] {
      std::map<std::string, at::Tensor> out;
      for (const auto& [name, t] : module.namedParameters()) out[name] = t.grad().clone();
      return out;
    };
    auto zeroGrads = [&] {
      for (const at::Tensor& t : module.parameters()) t.mutable_grad().zero_();
    };
    result.loss = module.trainStep(batch)[0].item<double>();
    result.plainGrads = grads();
    result.plainNorm = module.unscaleGradients(1.0);
    zeroGrads();
    module.setLossScale(kScale);
    result.scaledLoss = module.trainStep(batch)[0].item<double>();
    result.scaledGrads = grads();
    result.unscaledNorm = module.unscaleGradients(kScale);
    result.unscaledGrads = grads();
    RANK_CHECK(testing::errorOf([&] { module.setLossScale(0); })
                   .find("the loss scale must be a positive finite number, got 0") !=
               std::string::npos);
  }));
  // An overflow in one replica's backward (rank 3's, before the gradients are summed over the
  // replicas: gradient accumulation leaves them local until allreduceGrads).
  struct DelayedAllreduce {
    DelayedAllreduce() { staging::setDelayGradAllreduce(true); }
    ~DelayedAllreduce() { staging::setDelayGradAllreduce(false); }
  };
  {
    DelayedAllreduce delayed;
    testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& backend) {
      const int rank = backend.rank();
      ModuleOptions options;
      options.backend = testing::borrow(backend);
      options.planner = [](const PlanningInput& in) {
        return testing::makeDeployment(in.model.graph, {{0, 1}, {2, 3}}, in.worldSize, 2, "1f1b");
      };
      Module module(copies[rank], options);
      module.setLossScale(kScale);
      module.trainStep({x.narrow(0, rank * kLocal, kLocal), y.narrow(0, rank * kLocal, kLocal)});
      if (rank == 3) module.parameters().front().mutable_grad().view(-1)[0].fill_(INFINITY);
      module.trainingExecutor().allreduceGrads();
      results[rank].overflowNorm = module.unscaleGradients(kScale);
    }));
  }
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    const ScaledResult& result = results[r];
    CHECK(result.scaledLoss == Approx(result.loss).epsilon(1e-6));
    REQUIRE(!result.plainGrads.empty());
    for (const auto& [name, plain] : result.plainGrads) {
      INFO("parameter " << name);
      CHECK(testing::allClose(result.scaledGrads.at(name), plain * kScale, 1e-5, 1e-6 * kScale));
      CHECK(testing::allClose(result.unscaledGrads.at(name), plain));
    }
    CHECK(std::isfinite(result.plainNorm));
    CHECK(result.unscaledNorm == Approx(result.plainNorm).epsilon(1e-5));
    CHECK(result.unscaledNorm == Approx(results[0].unscaledNorm).epsilon(1e-12));
    CHECK_FALSE(std::isfinite(result.overflowNorm));  // rank 3's inf, every rank's verdict
  }
}

}  // namespace
}  // namespace autostage::driver
