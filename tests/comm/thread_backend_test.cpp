// The thread backend with 4 in-process ranks. Assertions run on the main thread only (Catch2
// is not thread-safe): rank bodies record what they received, the test compares it with values
// computed locally.
#include "comm/thread_backend.h"

#include <atomic>
#include "catch_torch.h"
#include <mutex>
#include <thread>

#include "comm_test_util.h"
#include "core/error.h"

using namespace autostage;
using namespace autostage::comm;
using testing::allDtypes;
using testing::errorOf;
using testing::firstError;
using testing::pattern;

namespace {
constexpr int kRanks = 4;
const std::vector<std::vector<int64_t>> kShapes = {{}, {0}, {7}, {3, 4, 5}};
}  // namespace

TEST_CASE("send/recv moves every dtype and shape around a ring", "[comm]") {
  // received[rank][dtype][shape]
  std::vector<std::vector<at::Tensor>> received(kRanks);
  auto errors = runThreadRanks(kRanks, [&](ThreadBackend& backend) {
    int next = (backend.rank() + 1) % kRanks, prev = (backend.rank() + kRanks - 1) % kRanks;
    int tag = 0;
    for (at::ScalarType dtype : allDtypes())
      for (const auto& shape : kShapes) {
        backend.send(pattern(dtype, shape, backend.rank()), next, tag);
        at::Tensor into = at::empty(shape, dtype);
        backend.recv(into, prev, tag++);
        received[backend.rank()].push_back(into);
      }
  });
  REQUIRE(firstError(errors) == "");
  for (int rank = 0; rank < kRanks; ++rank) {
    size_t i = 0;
    for (at::ScalarType dtype : allDtypes())
      for (const auto& shape : kShapes) {
        INFO("rank " << rank << " dtype " << dtype << " shape " << at::IntArrayRef(shape));
        REQUIRE(
            at::equal(received[rank][i++], pattern(dtype, shape, (rank + kRanks - 1) % kRanks)));
      }
  }
}

TEST_CASE("irecv matches by tag and in send order within one tag", "[comm]") {
  std::vector<at::Tensor> got(4);
  auto errors = runThreadRanks(2, [&](ThreadBackend& backend) {
    if (backend.rank() == 0) {
      auto a = backend.isend(at::full({2}, 10.0), 1, 1);
      auto b = backend.isend(at::full({2}, 20.0), 1, 2);
      backend.send(at::full({2}, 30.0), 1, 3);
      backend.send(at::full({2}, 40.0), 1, 3);
      a->wait();
      b->wait();
      return;
    }
    for (auto& t : got) t = at::zeros({2});
    auto second = backend.irecv(got[1], 0, 2);  // posted first, for the later tag
    auto first = backend.irecv(got[0], 0, 1);
    auto third = backend.irecv(got[2], 0, 3);
    auto fourth = backend.irecv(got[3], 0, 3);
    fourth->wait();  // waiting out of order must not swap same-tag messages
    third->wait();
    first->wait();
    second->wait();
    if (!first->isCompleted()) throw InternalError("completed work reports not completed");
  });
  REQUIRE(firstError(errors) == "");
  REQUIRE(at::equal(got[0], at::full({2}, 10.0)));
  REQUIRE(at::equal(got[1], at::full({2}, 20.0)));
  REQUIRE(at::equal(got[2], at::full({2}, 30.0)));
  REQUIRE(at::equal(got[3], at::full({2}, 40.0)));
}

TEST_CASE("allReduce sum and average over the world for several dtypes", "[comm]") {
  std::vector<std::vector<at::Tensor>> sums(kRanks), averages(kRanks);
  auto errors = runThreadRanks(kRanks, [&](ThreadBackend& backend) {
    for (at::ScalarType dtype : allDtypes()) {
      at::Tensor t = pattern(dtype, {3, 5}, backend.rank());
      backend.allReduce(t, ReduceOp::Sum, backend.world());
      sums[backend.rank()].push_back(t);
    }
    for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf}) {
      at::Tensor t = pattern(dtype, {3, 5}, backend.rank()).mul(4);
      backend.allReduce(t, ReduceOp::Average, backend.world());
      averages[backend.rank()].push_back(t);
    }
  });
  REQUIRE(firstError(errors) == "");
  for (int rank = 0; rank < kRanks; ++rank) {
    size_t i = 0;
    for (at::ScalarType dtype : allDtypes()) {
      at::Tensor expected = pattern(at::kLong, {3, 5}, 0).mul(0);
      for (int r = 0; r < kRanks; ++r) expected += pattern(dtype, {3, 5}, r).to(at::kLong);
      if (dtype == at::kBool) expected = expected.gt(0);
      INFO("rank " << rank << " dtype " << dtype);
      REQUIRE(at::equal(sums[rank][i++], expected.to(dtype)));
    }
    i = 0;
    for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf}) {
      at::Tensor expected = pattern(at::kDouble, {3, 5}, 0).mul(0);
      for (int r = 0; r < kRanks; ++r) expected += pattern(dtype, {3, 5}, r).to(at::kDouble);
      REQUIRE(at::equal(averages[rank][i++], expected.to(dtype)));
    }
  }
}

TEST_CASE("allReduce on subgroup 1 and 3 leaves ranks 0 and 2 uninvolved", "[comm]") {
  std::vector<at::Tensor> result(kRanks);
  auto errors = runThreadRanks(kRanks, [&](ThreadBackend& backend) {
    at::Tensor t = at::full({4}, 1.0 + backend.rank());
    if (backend.rank() % 2 == 1) {
      backend.allReduce(t, ReduceOp::Sum, Group({3, 1}));
      backend.allReduce(t, ReduceOp::Average, Group({1, 3}));
    }
    // Ranks 0 and 2 never call the group's collectives; they run their own group instead.
    if (backend.rank() % 2 == 0) backend.allReduce(t, ReduceOp::Sum, Group({0, 2}));
    result[backend.rank()] = t;
  });
  REQUIRE(firstError(errors) == "");
  REQUIRE(at::equal(result[1], at::full({4}, 6.0)));  // (2 + 4) summed, then averaged
  REQUIRE(at::equal(result[3], at::full({4}, 6.0)));
  REQUIRE(at::equal(result[0], at::full({4}, 4.0)));  // 1 + 3
  REQUIRE(at::equal(result[2], at::full({4}, 4.0)));
}

TEST_CASE("broadcast of tensors and bytes on the world and a subgroup", "[comm]") {
  std::vector<at::Tensor> world(kRanks), sub(kRanks);
  std::vector<std::string> bytes(kRanks);
  std::vector<std::vector<std::string>> gathered(kRanks);
  const std::string deployment = std::string("stage\0plan", 10) + std::string(5000, 'x');
  auto errors = runThreadRanks(kRanks, [&](ThreadBackend& backend) {
    int rank = backend.rank();
    world[rank] = rank == 2 ? pattern(at::kLong, {6}, 7) : at::zeros({6}, at::kLong);
    backend.broadcast(world[rank], 2, backend.world());
    if (rank == 1 || rank == 3) {
      sub[rank] = rank == 3 ? pattern(at::kFloat, {2, 2}, 5) : at::zeros({2, 2});
      backend.broadcast(sub[rank], 3, Group({1, 3}));
    }
    bytes[rank] = rank == 0 ? deployment : "stale";
    backend.broadcastBytes(bytes[rank], 0, backend.world());
    gathered[rank] = backend.allGatherBytes(std::string(rank * 3, 'a' + rank), backend.world());
  });
  REQUIRE(firstError(errors) == "");
  for (int rank = 0; rank < kRanks; ++rank) {
    REQUIRE(at::equal(world[rank], pattern(at::kLong, {6}, 7)));
    REQUIRE(bytes[rank] == deployment);
    REQUIRE(gathered[rank] == std::vector<std::string>{"", "bbb", "cccccc", "ddddddddd"});
  }
  REQUIRE(at::equal(sub[1], pattern(at::kFloat, {2, 2}, 5)));
  REQUIRE(!sub[0].defined());
}

TEST_CASE("allGather returns every member's tensor in rank order", "[comm]") {
  std::vector<std::vector<at::Tensor>> world(kRanks), sub(kRanks);
  auto errors = runThreadRanks(kRanks, [&](ThreadBackend& backend) {
    int rank = backend.rank();
    world[rank] = backend.allGather(pattern(at::kInt, {2, 3}, rank), backend.world());
    if (rank != 1)
      sub[rank] = backend.allGather(pattern(at::kDouble, {4}, 10 * rank), Group({0, 2, 3}));
  });
  REQUIRE(firstError(errors) == "");
  for (int rank = 0; rank < kRanks; ++rank) {
    REQUIRE(world[rank].size() == kRanks);
    for (int r = 0; r < kRanks; ++r)
      REQUIRE(at::equal(world[rank][r], pattern(at::kInt, {2, 3}, r)));
    if (rank == 1) continue;
    REQUIRE(sub[rank].size() == 3);
    for (int i = 0; i < 3; ++i)
      REQUIRE(
          at::equal(sub[rank][i], pattern(at::kDouble, {4}, 10 * std::vector<int>{0, 2, 3}[i])));
  }
}

TEST_CASE("barrier releases no rank before every rank arrived", "[comm]") {
  std::atomic<int> arrived{0};
  std::vector<int> seen(kRanks, -1);
  auto errors = runThreadRanks(kRanks, [&](ThreadBackend& backend) {
    if (backend.rank() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ++arrived;
    backend.barrier(backend.world());
    seen[backend.rank()] = arrived.load();
  });
  REQUIRE(firstError(errors) == "");
  REQUIRE(seen == std::vector<int>(kRanks, kRanks));
}
