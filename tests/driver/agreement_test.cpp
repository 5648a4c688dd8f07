// Note [One agreement per call] (driver/module.h) and Note [Agreed inputs] (staging/executor.h):
// once a module is deployed, each call makes exactly one exchange of bytes between the ranks
// (the agreement on the call and its inputs); the executor's own step makes none.
#include <thread>

#include "catch_torch.h"
#include <torch/torch.h>

#include "comm/thread_backend.h"
#include "comm/thread_world.h"
#include "driver/module.h"
#include "test_support.h"

namespace autostage::driver {
namespace {

constexpr int kWorld = 2;
constexpr int64_t kLocal = 4;

// A thread rank that counts its exchanges of bytes (the agreements use allGatherBytes).
class CountingBackend final : public comm::ThreadBackend {
 public:
  using ThreadBackend::ThreadBackend;
  std::vector<std::string> allGatherBytes(const std::string& data,
                                          const comm::Group& group) override {
    ++byteExchanges;
    return ThreadBackend::allGatherBytes(data, group);
  }
  int byteExchanges = 0;
};

// Runs `body` on kWorld thread ranks of counting backends; rethrows the first failure.
void runCountingRanks(const std::function<void(CountingBackend&)>& body) {
  auto world = std::make_shared<comm::ThreadWorld>(kWorld, comm::CommOptions{});
  std::vector<std::exception_ptr> errors(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank)
    threads.emplace_back([&, rank] {
      try {
        CountingBackend backend(world, rank);
        body(backend);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  staging::testing::rethrowFirst(errors);
}

ModuleOptions twoStages(comm::Backend& backend, const std::string& schedule) {
  ModuleOptions options;
  options.backend = staging::testing::borrow(backend);
  options.planner = [schedule](const PlanningInput& in) {
    return staging::testing::makeDeployment(in.model.graph, {{0}, {1}}, in.worldSize, 2,
                                            schedule);
  };
  return options;
}

torch::jit::Module seeded(torch::jit::Module (*make)()) {
  torch::manual_seed(31);
  return make();
}

TEST_CASE("each call of a deployed module makes one exchange between the ranks", "[driver]") {
  std::vector<std::vector<int>> forwardExchanges(kWorld), trainExchanges(kWorld);
  runCountingRanks([&](CountingBackend& backend) {
    const int rank = backend.rank();
    {
      Module module(seeded(staging::testing::makeMlp), twoStages(backend, "gpipe"));
      for (int step = 0; step < 3; ++step) {
        const int before = backend.byteExchanges;
        at::Tensor out = module.forward({torch::randn({kLocal, 8})})[0];
        out.pow(2).mean().backward();
        forwardExchanges[rank].push_back(backend.byteExchanges - before);
      }
    }
    Module lossModule(seeded(staging::testing::makeLossMlp), twoStages(backend, "1f1b"));
    for (int step = 0; step < 3; ++step) {
      const int before = backend.byteExchanges;
      lossModule.trainStep({torch::randn({kLocal, 8}), torch::randn({kLocal, 4})});
      trainExchanges[rank].push_back(backend.byteExchanges - before);
    }
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    INFO("rank " << rank);
    // The first call also traces, plans, verifies and deploys (several exchanges); every later
    // one agrees on its call once.
    CHECK(forwardExchanges[rank][0] > 1);
    CHECK(forwardExchanges[rank][1] == 1);
    CHECK(forwardExchanges[rank][2] == 1);
    CHECK(trainExchanges[rank][0] > 1);
    CHECK(trainExchanges[rank][1] == 1);
    CHECK(trainExchanges[rank][2] == 1);
  }
}

TEST_CASE("local batch sizes that differ between the ranks are refused on every rank",
          "[driver]") {
  // The executor no longer exchanges them itself: the call's one agreement must catch it.
  std::vector<std::string> errors(kWorld);
  runCountingRanks([&](CountingBackend& backend) {
    Module module(seeded(staging::testing::makeMlp), twoStages(backend, "gpipe"));
    module.forward({torch::randn({kLocal, 8})})[0].sum().backward();  // deployed
    try {
      module.forward({torch::randn({backend.rank() == 0 ? kLocal : kLocal + 2, 8})});
    } catch (const std::exception& e) {
      errors[backend.rank()] = e.what();
    }
  });
  for (const std::string& error : errors)
    CHECK_THAT(error, Catch::Contains("ranks passed different local batch sizes"));
}

}  // namespace
}  // namespace autostage::driver
