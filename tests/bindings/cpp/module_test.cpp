// The C++ API as a user sees it (bindings/cpp/module.h): config keys as options, state dicts in and
// out, bad input with the Python API's messages. In-process ranks (thread backend).
#include <torch/torch.h>

#include "bindings/cpp/module.h"
#include "comm/thread_backend.h"
#include "core/config.h"
#include "core/error.h"
#include "test_support.h"

#include <catch2/catch.hpp>  // last: glog's CHECK must not replace Catch2's (NOTES-libtorch.md)

namespace autostage {
namespace {

constexpr int kWorld = 2;

// Options for in-process ranks: this rank's thread backend, the default planner over it.
ModuleOptions threadOptions(comm::Backend& backend) {
  core::globalConfig().set("measure_comm", "false", "test");
  core::globalConfig().set("profile_pass_seconds", "0", "test");
  ModuleOptions options = ModuleOptions::fromConfig();
  options.backend = staging::testing::borrow(backend);
  return options;
}

TEST_CASE("a config key that does not exist is a ConfigError naming it", "[api]") {
  torch::manual_seed(1);
  CHECK_THROWS_AS(Module(staging::testing::makeMlp(), ConfigOptions{{"partition_nmu", "2"}}),
                  ConfigError);
  CHECK_THROWS_WITH(Module(staging::testing::makeMlp(), ConfigOptions{{"partition_nmu", "2"}}),
                    Catch::Contains("unknown option 'partition_nmu'") &&
                        Catch::Contains("known options"));
  CHECK_THROWS_WITH(Module(staging::testing::makeMlp(), ConfigOptions{{"partition_num", "two"}}),
                    Catch::Contains("partition_num"));
}

TEST_CASE("a module without parameters runs, as in Python", "[api]") {
  at::set_num_threads(1);
  torch::jit::Module relu("Relu");
  relu.define("def forward(self, x):\n    return torch.relu(x)\n");
  at::Tensor x = torch::randn({kWorld * 4, 3});
  staging::testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    Module module(relu.clone(), threadOptions(b));
    at::Tensor rows = x.narrow(0, 4 * b.rank(), 4);
    CHECK(torch::equal(module.forward({rows})[0], torch::relu(rows)));
    CHECK(module.parameters().empty());
  }));
}

TEST_CASE("inputs on another device than the stages' are refused on every rank", "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(3);
  torch::jit::Module mlp = staging::testing::makeMlp();
  auto errors = comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    Module module(mlp.clone(), threadOptions(b));
    // Rank 1 alone passes a tensor of another device (meta: this machine has no GPU).
    at::Tensor x = b.rank() == 1 ? at::empty({4, 8}, at::TensorOptions().device(at::kMeta))
                                 : torch::randn({4, 8});
    module.forward({x});
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r]);
    CHECK_THROWS_WITH(std::rethrow_exception(errors[r]),
                      Catch::Contains("rank 1: input 0 is on meta") &&
                          Catch::Contains("stages run on cpu") &&
                          Catch::Contains("pass inputs on the cpu"));
  }
}

TEST_CASE("loadStateDict loads on every rank and refuses what does not fit, loading nothing",
          "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(2);
  torch::jit::Module reference = staging::testing::makeMlp();
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& p : reference.named_parameters()) state.emplace_back(p.name, p.value * 3);
  at::Tensor x = torch::randn({kWorld * 4, 8});
  at::Tensor expected;
  {
    torch::NoGradGuard noGrad;
    for (const auto& p : reference.named_parameters()) p.value.mul_(3);
    expected = reference.forward({x}).toTensor();
  }
  staging::testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    torch::manual_seed(5);
    Module module(staging::testing::makeMlp(), threadOptions(b));
    at::Tensor rows = x.narrow(0, 4 * b.rank(), 4);
    module.forward({rows});  // deployed first: the stages see what is loaded later
    auto wrong = state;
    wrong[0].second = torch::zeros({1, 1});
    wrong.emplace_back("extra", torch::zeros({2}));
    const auto before = module.stateDict();
    CHECK_THROWS_AS(module.loadStateDict(wrong), FormatError);
    CHECK_THROWS_WITH(module.loadStateDict(wrong),
                      Catch::Contains("'" + state[0].first + "' has shape [1, 1]") &&
                          Catch::Contains("'extra' is in the checkpoint but not in the model") &&
                          Catch::Contains("Nothing was loaded"));
    const auto after = module.stateDict();
    for (size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(before[i].second, after[i].second));
    module.loadStateDict(state);
    at::Tensor out = module.forward({rows})[0];
    CHECK(staging::testing::allClose(out, expected.narrow(0, 4 * b.rank(), 4)));
  }));
}

}  // namespace
}  // namespace autostage
