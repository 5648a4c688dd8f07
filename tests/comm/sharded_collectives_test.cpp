// reduceScatter and allGatherInto (Note [Sharded collectives] in comm/backend.h) on thread ranks.
// Rank bodies record what they received; assertions run on the main thread (Catch2 2.x is not
// thread-safe).
#include "catch_torch.h"

#include "comm/thread_backend.h"
#include "comm_test_util.h"
#include "core/error.h"

using namespace autostage;
using namespace autostage::comm;
using testing::firstError;
using testing::pattern;

namespace {
constexpr int kRanks = 4;
const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kLong,
                                             at::kInt};
}  // namespace

TEST_CASE("reduceScatter gives each member the sum of its chunk", "[comm]") {
  const int64_t chunk = 5;
  // shards[rank][dtype]
  std::vector<std::vector<at::Tensor>> shards(kRanks), averages(kRanks);
  auto errors = runThreadRanks(kRanks, [&](ThreadBackend& backend) {
    for (at::ScalarType dtype : kDtypes) {
      at::Tensor out = at::empty({chunk}, dtype);
      backend.reduceScatter(pattern(dtype, {kRanks * chunk}, backend.rank()), out, ReduceOp::Sum,
                            backend.world());
      shards[backend.rank()].push_back(out);
    }
    at::Tensor average = at::empty({2}, at::kDouble);
    backend.reduceScatter(pattern(at::kDouble, {2 * kRanks}, backend.rank()), average,
                          ReduceOp::Average, backend.world());
    averages[backend.rank()].push_back(average);
  });
  REQUIRE(firstError(errors) == "");
  for (size_t d = 0; d < kDtypes.size(); ++d) {
    at::Tensor total = at::zeros({kRanks * chunk}, at::kDouble);
    for (int r = 0; r < kRanks; ++r)
      total += pattern(kDtypes[d], {kRanks * chunk}, r).to(at::kDouble);
    for (int r = 0; r < kRanks; ++r) {
      INFO("rank " << r << " dtype " << kDtypes[d]);
      REQUIRE(at::equal(shards[r][d].to(at::kDouble), total.narrow(0, r * chunk, chunk)));
    }
  }
  at::Tensor mean = at::zeros({2 * kRanks}, at::kDouble);
  for (int r = 0; r < kRanks; ++r) mean += pattern(at::kDouble, {2 * kRanks}, r);
  mean /= kRanks;
  for (int r = 0; r < kRanks; ++r) REQUIRE(at::allclose(averages[r][0], mean.narrow(0, 2 * r, 2)));
}

TEST_CASE("allGatherInto places member i's input in chunk i", "[comm]") {
  std::vector<at::Tensor> world(kRanks), sub(kRanks);
  auto errors = runThreadRanks(kRanks, [&](ThreadBackend& backend) {
    const int rank = backend.rank();
    at::Tensor into = at::empty({kRanks * 3}, at::kFloat);
    backend.allGatherInto(pattern(at::kFloat, {3}, rank), into, backend.world());
    world[rank] = into;
    if (rank != 0) {
      // A view into a larger buffer is written in place.
      at::Tensor buffer = at::zeros({10}, at::kLong);
      backend.allGatherInto(at::full({2}, rank, at::kLong), buffer.narrow(0, 2, 6),
                            Group({1, 2, 3}));
      sub[rank] = buffer;
    }
  });
  REQUIRE(firstError(errors) == "");
  for (int r = 0; r < kRanks; ++r)
    for (int i = 0; i < kRanks; ++i)
      REQUIRE(at::equal(world[r].narrow(0, 3 * i, 3), pattern(at::kFloat, {3}, i)));
  at::Tensor expected = at::tensor({0, 0, 1, 1, 2, 2, 3, 3, 0, 0}, at::kLong);
  for (int r = 1; r < kRanks; ++r) REQUIRE(at::equal(sub[r], expected));
}

TEST_CASE("reduceScatter then allGatherInto equals allReduce", "[comm]") {
  std::vector<at::Tensor> viaShards(kRanks), viaAllReduce(kRanks);
  auto errors = runThreadRanks(kRanks, [&](ThreadBackend& backend) {
    const int rank = backend.rank();
    at::Tensor local = pattern(at::kFloat, {8}, rank);
    at::Tensor shard = at::empty({2}, at::kFloat);
    backend.reduceScatter(local, shard, ReduceOp::Sum, backend.world());
    viaShards[rank] = at::empty({8}, at::kFloat);
    backend.allGatherInto(shard, viaShards[rank], backend.world());
    viaAllReduce[rank] = local.clone();
    backend.allReduce(viaAllReduce[rank], ReduceOp::Sum, backend.world());
  });
  REQUIRE(firstError(errors) == "");
  for (int r = 0; r < kRanks; ++r) REQUIRE(at::equal(viaShards[r], viaAllReduce[r]));
}

TEST_CASE("sharded collectives reject sizes that do not split over the group", "[comm]") {
  std::vector<std::string> messages(2);
  auto errors = runThreadRanks(2, [&](ThreadBackend& backend) {
    try {
      backend.reduceScatter(at::zeros({5}), at::empty({2}), ReduceOp::Sum, backend.world());
    } catch (const Error& e) {
      messages[backend.rank()] = e.what();
    }
  });
  REQUIRE(firstError(errors) == "");
  for (const std::string& m : messages) REQUIRE_THAT(m, Catch::Contains("pad it to a multiple"));
}
