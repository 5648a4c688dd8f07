#include "staging/checkpoint.h"

#include <mutex>

#include "catch_torch.h"
#include <torch/torch.h>

#include "comm/thread_backend.h"
#include "core/error.h"
#include "test_support.h"

namespace autostage::staging {
namespace {

TEST_CASE("gatherFromOwners gives every rank each name once, from its lowest owner",
          "[staging]") {
  const at::Tensor a = torch::arange(6, torch::kFloat).reshape({2, 3});
  const at::Tensor b = torch::tensor({4, 5, 6, 7}, torch::kLong);
  const at::Tensor c = torch::tensor(2.5, torch::kDouble);  // 0-dim
  std::vector<NamedTensors> results(3);
  testing::rethrowFirst(comm::runThreadRanks(3, [&](comm::ThreadBackend& backend) {
    NamedTensors owned;
    if (backend.rank() == 0) owned = {{"c", c}, {"a", a}};
    // Rank 1's replica of "a" is stale: the lowest owner's copy is the one taken.
    if (backend.rank() == 1) owned = {{"a", a + 100}, {"b", b}};
    results[backend.rank()] = gatherFromOwners(backend, owned);  // rank 2 owns nothing
  }));
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    const NamedTensors& got = results[r];
    REQUIRE(got.size() == 3);
    CHECK(got[0].first == "a");
    CHECK(torch::equal(got[0].second, a));
    CHECK(got[1].first == "b");
    CHECK(torch::equal(got[1].second, b));
    CHECK(got[2].first == "c");
    CHECK(got[2].second.dim() == 0);
    CHECK(torch::equal(got[2].second, c));
  }
}

TEST_CASE("gatherFromOwners refuses owners that disagree on a shape, on every rank",
          "[staging]") {
  std::mutex mutex;
  std::vector<std::string> messages;
  testing::rethrowFirst(comm::runThreadRanks(2, [&](comm::ThreadBackend& backend) {
    NamedTensors owned = {{"w", torch::zeros({backend.rank() + 2})}};
    try {
      gatherFromOwners(backend, owned);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(e.what());
    }
  }));
  REQUIRE(messages.size() == 2);
  for (const std::string& message : messages)
    CHECK_THAT(message, Catch::Contains("'w' has a different dtype or shape on rank 1 than on "
                                        "rank 0"));
}

}  // namespace
}  // namespace autostage::staging
