// Note [One deployment per usage] (driver/module.h) and Note [Measured memory]
// (staging/memory_meter.h): which deployment each call runs, and what a step's memory record
// holds, on in-process ranks (thread backend) with hand-built deployments and a scripted meter.
#include <mutex>

#include <torch/torch.h>

#include "comm/thread_backend.h"
#include "core/error.h"
#include "staging/memory_watch.h"
#include "driver/module.h"
#include "test_support.h"

#include "catch_torch.h"  // last: glog's CHECK must not replace Catch2's (NOTES-libtorch.md)

namespace autostage::driver {
namespace {

using namespace staging;

using testing::borrow;
using testing::makeDeployment;

constexpr int kWorld = 2;
constexpr int64_t kLocal = 4;

// The schedule each usage gets, as the planner would choose it.
std::string scheduleFor(core::PlanUsage usage) {
  return usage == core::PlanUsage::TrainStep ? "1f1b" : "gpipe";
}

ModuleOptions recordingOptions(comm::Backend& backend, std::vector<std::string>* planned,
                               std::mutex* mutex) {
  ModuleOptions options;
  options.backend = borrow(backend);
  options.planner = [planned, mutex](const PlanningInput& in) {
    std::lock_guard<std::mutex> lock(*mutex);
    planned->push_back(core::usageName(in.usage));
    core::Deployment d = makeDeployment(in.model.graph, {{0}, {1}}, in.worldSize, 2,
                                        scheduleFor(in.usage));
    d.options[core::kUsageOption] = core::usageName(in.usage);
    return d;
  };
  return options;
}

TEST_CASE("each usage is planned once and runs its own schedule - the optimizer's parameters "
          "follow training deployments only", "[staging]") {
  at::set_num_threads(1);
  std::vector<std::string> planned;
  std::mutex mutex;
  std::vector<torch::jit::Module> copies;
  for (int r = 0; r < kWorld; ++r) {
    torch::manual_seed(3);
    copies.push_back(testing::makeLossMlp());
  }
  at::Tensor x = torch::randn({kWorld * kLocal, 8}), y = torch::randn({kWorld * kLocal, 4});
  testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& backend) {
    const int rank = backend.rank();
    Module module(copies[rank], recordingOptions(backend, &planned, &mutex));
    std::vector<c10::IValue> batch{x.narrow(0, rank * kLocal, kLocal),
                                   y.narrow(0, rank * kLocal, kLocal)};
    module.forward(batch)[0].backward();
    RANK_CHECK(module.usage() == core::PlanUsage::ForwardBackward);
    RANK_CHECK(module.deployment().schedule == "gpipe");
    RANK_CHECK(module.trainingSelection() == 1);
    const auto trained = module.parameters();
    module.trainStep(batch);
    RANK_CHECK(module.usage() == core::PlanUsage::TrainStep);
    RANK_CHECK(module.deployment().schedule == "1f1b");
    RANK_CHECK(module.trainingSelection() == 2);
    {
      torch::NoGradGuard noGrad;
      at::Tensor loss = module.forward(batch)[0];
      RANK_CHECK(!loss.requires_grad());
    }
    RANK_CHECK(module.usage() == core::PlanUsage::Inference);
    RANK_CHECK(module.trainingSelection() == 2);  // inference never moves the optimizer
    // The inference deployment budgets nothing for a backward: the executor refuses to train.
    std::vector<at::Tensor> tensors{batch[0].toTensor(), batch[1].toTensor()};
    RANK_CHECK_THAT(testing::errorOf([&] { module.executor().trainStep(tensors); }),
                    Catch::Contains("inference"));
    RANK_CHECK_THAT(testing::errorOf([&] { module.executor().forward(tensors); }),
                    Catch::Contains("no_grad"));
    RANK_CHECK(module.parameters().size() == trained.size());
    module.forward(batch)[0].backward();  // back to the first deployment: reused
    RANK_CHECK(module.usage() == core::PlanUsage::ForwardBackward);
    RANK_CHECK(module.trainingSelection() == 3);
    RANK_CHECK(module.deploymentCount() == 3);
  }));
  // Rank 0 planned each usage once, in the order of first use.
  CHECK(planned == std::vector<std::string>{"forward_backward", "train_step", "inference"});
}

TEST_CASE("a 1f1b deployment is refused by forward() on every rank, naming train_step",
          "[staging]") {
  at::set_num_threads(1);
  auto errors = comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& backend) {
    ModuleOptions options;
    options.backend = borrow(backend);
    options.planner = [](const PlanningInput& in) {
      return makeDeployment(in.model.graph, {{0}, {1}}, in.worldSize, 2, "1f1b");
    };
    torch::manual_seed(3);
    Module module(testing::makeMlp(), options);
    module.forward({torch::randn({kLocal, 8})});
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r]);
    CHECK_THROWS_AS(std::rethrow_exception(errors[r]), ConfigError);
    CHECK_THROWS_WITH(std::rethrow_exception(errors[r]),
                      Catch::Contains("schedule 1f1b") && Catch::Contains("forward()"));
  }
}

// A meter whose counters the test sets.
class ScriptedMeter final : public MemoryMeter {
 public:
  std::string name() const override { return "scripted"; }
  int64_t currentBytes() const override { return current; }
  int64_t peakBytes() const override { return peak; }
  void resetPeak() override { peak = current; }
  int64_t current = 0, peak = 0;
};

TEST_CASE("a step's memory record: exact parameters, gradients and optimizer state, the meter's "
          "growth as transient", "[staging]") {
  torch::manual_seed(3);
  torch::jit::Module mlp = testing::makeMlp();
  auto model = torchscript::importModule(mlp, {torch::randn({kLocal, 8})});
  std::vector<core::ValueId> ids;
  int64_t paramBytes = 0;
  for (core::ValueId v : model.graph.paramInputs()) ids.push_back(v);
  for (const at::Tensor& t : model.paramTensors) paramBytes += t.numel() * t.element_size();
  ParamStorage params(model, ids);
  core::Deployment deployment = makeDeployment(model.graph, {{0}}, 1, 1);
  deployment.stages[0].totalMemoryBytes = 10000;
  deployment.deviceMemory = 20000;
  deployment.options["mem_margin"] = "0.5";
  auto meter = std::make_shared<ScriptedMeter>();
  testing::rethrowFirst(comm::runThreadRanks(1, [&](comm::ThreadBackend& b) {
    MemoryWatch watch(meter, deployment, {0});
    watch.setOptimizerBytes(640);
    meter->current = 5000;
    watch.begin(params);
    meter->current = meter->peak = 9000;  // activations during the step
    meter->current = 5000;
    std::optional<StepMemory> m = watch.end(params, b);
    REQUIRE(m);
    CHECK(m->step == 1);
    CHECK(m->parameters == paramBytes);
    CHECK(m->gradients == 0);
    CHECK(m->optimizer == 640);
    CHECK(m->transient == 4000);
    CHECK(m->measuredPeak == paramBytes + 640 + 4000);
    CHECK(m->predicted == 10000);
    CHECK(m->usable == 10000);
    // Gradients allocated inside the window are reported as gradients, not transient; without a
    // reported optimizer state, the meter's resident bytes (less gradients) stand in for it.
    watch.setOptimizerBytes(-1);
    watch.begin(params);
    int64_t gradBytes = 0;
    for (const at::Tensor& p : params.parameters()) {
      p.mutable_grad() = torch::ones_like(p);
      gradBytes += p.numel() * p.element_size();
    }
    meter->peak = 5000 + gradBytes + 100;
    m = watch.end(params, b);
    CHECK(m->step == 2);
    CHECK(m->gradients == gradBytes);
    CHECK(m->transient == 100);
    CHECK(m->optimizer == 5000);
    CHECK_FALSE(watch.end(params, b));  // no window open
  }));
}

}  // namespace
}  // namespace autostage::driver
