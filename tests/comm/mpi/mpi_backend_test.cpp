// The MPI backend under `mpirun -n 4`: every rank runs every test case in the same order and
// compares what it received with values it computes locally. A failing rank makes its peers
// fail by timeout (never hang), so the job always ends.
#include "comm/mpi_backend.h"

#include "catch_torch.h"

#include "comm/registry.h"
#include "comm_test_util.h"
#include "core/error.h"

using namespace autostage;
using namespace autostage::comm;
using testing::allDtypes;
using testing::pattern;

namespace {
MpiBackend& mpi() {
  static std::shared_ptr<Backend> backend = [] {
    registerBuiltinBackends();
    return backendFor(at::ones({1}));
  }();
  return dynamic_cast<MpiBackend&>(*backend);
}
const std::vector<std::vector<int64_t>> kShapes = {{}, {0}, {7}, {3, 4, 5}, {300, 1000}};
}  // namespace

TEST_CASE("MPI world of 4 ranks on one node", "[comm][mpi]") {
  REQUIRE(mpi().name() == "mpi");
  REQUIRE(mpi().worldSize() == 4);
  REQUIRE(mpi().localSize() == 4);
  REQUIRE(mpi().localRank() == mpi().rank());
}

TEST_CASE("MPI send/recv around a ring for every dtype and shape", "[comm][mpi]") {
  int rank = mpi().rank(), next = (rank + 1) % 4, prev = (rank + 3) % 4;
  int tag = 0;
  for (at::ScalarType dtype : allDtypes())
    for (const auto& shape : kShapes) {
      // isend first: a blocking send of a large tensor would wait for a receive that every
      // rank only posts after its own send.
      auto sending = mpi().isend(pattern(dtype, shape, rank), next, tag);
      at::Tensor into = at::empty(shape, dtype);
      mpi().recv(into, prev, tag++);
      sending->wait();
      INFO("dtype " << dtype << " shape " << at::IntArrayRef(shape));
      REQUIRE(at::equal(into, pattern(dtype, shape, prev)));
    }
}

TEST_CASE("MPI irecv matches by tag and in send order within one tag", "[comm][mpi]") {
  if (mpi().rank() == 0) {
    auto a = mpi().isend(at::full({2}, 10.0), 1, 1);
    auto b = mpi().isend(at::full({2}, 20.0), 1, 2);
    mpi().send(at::full({2}, 30.0), 1, 3);
    mpi().send(at::full({2}, 40.0), 1, 3);
    a->wait();
    b->wait();
  } else if (mpi().rank() == 1) {
    std::vector<at::Tensor> got = {at::zeros({2}), at::zeros({2}), at::zeros({2}), at::zeros({2})};
    auto second = mpi().irecv(got[1], 0, 2);
    auto first = mpi().irecv(got[0], 0, 1);
    auto third = mpi().irecv(got[2], 0, 3);
    auto fourth = mpi().irecv(got[3], 0, 3);
    fourth->wait();
    third->wait();
    first->wait();
    second->wait();
    REQUIRE(first->isCompleted());
    for (int i = 0; i < 4; ++i) REQUIRE(at::equal(got[i], at::full({2}, 10.0 * (i + 1))));
  }
  mpi().barrier(mpi().world());
}

TEST_CASE("MPI allReduce sum and average over the world", "[comm][mpi]") {
  for (at::ScalarType dtype : allDtypes()) {
    at::Tensor t = pattern(dtype, {3, 5}, mpi().rank());
    mpi().allReduce(t, ReduceOp::Sum, mpi().world());
    at::Tensor expected = at::zeros({3, 5}, at::kLong);
    for (int r = 0; r < 4; ++r) expected += pattern(dtype, {3, 5}, r).to(at::kLong);
    if (dtype == at::kBool) expected = expected.gt(0);
    INFO("dtype " << dtype);
    REQUIRE(at::equal(t, expected.to(dtype)));
  }
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    at::Tensor t = pattern(dtype, {3, 5}, mpi().rank()).mul(4);
    mpi().allReduce(t, ReduceOp::Average, mpi().world());
    at::Tensor expected = at::zeros({3, 5}, at::kDouble);
    for (int r = 0; r < 4; ++r) expected += pattern(dtype, {3, 5}, r).to(at::kDouble);
    INFO("dtype " << dtype);
    REQUIRE(at::equal(t, expected.to(dtype)));
  }
}

TEST_CASE("MPI allReduce on subgroup 1 and 3 while ranks 0 and 2 run their own group",
          "[comm][mpi]") {
  at::Tensor t = at::full({4}, 1.0 + mpi().rank());
  if (mpi().rank() % 2 == 1) {
    mpi().allReduce(t, ReduceOp::Sum, Group({1, 3}));
    mpi().allReduce(t, ReduceOp::Average, Group({1, 3}));
    REQUIRE(at::equal(t, at::full({4}, 6.0)));
  } else {
    mpi().allReduce(t, ReduceOp::Sum, Group({0, 2}));
    REQUIRE(at::equal(t, at::full({4}, 4.0)));
  }
  // Rank 2 alone in a group, and a 3-member group that rank 1 never touches.
  if (mpi().rank() != 1) {
    at::Tensor u = at::full({1}, 1.0);
    mpi().allReduce(u, ReduceOp::Sum, Group({0, 2, 3}));
    REQUIRE(u.item<double>() == 3.0);
  }
  mpi().barrier(mpi().world());
}

TEST_CASE("MPI broadcast and allGather of tensors and bytes", "[comm][mpi]") {
  int rank = mpi().rank();
  at::Tensor t = rank == 2 ? pattern(at::kLong, {6}, 7) : at::zeros({6}, at::kLong);
  mpi().broadcast(t, 2, mpi().world());
  REQUIRE(at::equal(t, pattern(at::kLong, {6}, 7)));
  if (rank == 1 || rank == 3) {
    at::Tensor s = rank == 3 ? pattern(at::kHalf, {2, 2}, 5) : at::zeros({2, 2}, at::kHalf);
    mpi().broadcast(s, 3, Group({1, 3}));
    REQUIRE(at::equal(s, pattern(at::kHalf, {2, 2}, 5)));
  }
  const std::string deployment = std::string("stage\0plan", 10) + std::string(100000, 'x');
  std::string bytes = rank == 0 ? deployment : "stale";
  mpi().broadcastBytes(bytes, 0, mpi().world());
  REQUIRE(bytes == deployment);

  std::vector<at::Tensor> gathered =
      mpi().allGather(pattern(at::kInt, {2, 3}, rank), mpi().world());
  REQUIRE(gathered.size() == 4);
  for (int r = 0; r < 4; ++r) REQUIRE(at::equal(gathered[r], pattern(at::kInt, {2, 3}, r)));
  std::vector<std::string> names =
      mpi().allGatherBytes(std::string(rank * 3, 'a' + rank), mpi().world());
  REQUIRE(names == std::vector<std::string>{"", "bbb", "cccccc", "ddddddddd"});
  if (rank != 0) {
    auto sub = mpi().allGather(at::full({1}, 10.0 * rank), Group({1, 2, 3}));
    REQUIRE(sub.size() == 3);
    for (int i = 0; i < 3; ++i) REQUIRE(sub[i].item<double>() == 10.0 * (i + 1));
  }
  mpi().barrier(mpi().world());
}

TEST_CASE("MPI reduceScatter and allGatherInto (ZeRO-1's collectives)", "[comm][mpi]") {
  const int rank = mpi().rank();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    at::Tensor shard = at::empty({3}, dtype);
    mpi().reduceScatter(pattern(dtype, {12}, rank), shard, ReduceOp::Sum, mpi().world());
    at::Tensor total = at::zeros({12}, at::kDouble);
    for (int r = 0; r < 4; ++r) total += pattern(dtype, {12}, r).to(at::kDouble);
    REQUIRE(at::equal(shard.to(at::kDouble), total.narrow(0, 3 * rank, 3)));
    at::Tensor whole = at::empty({12}, dtype);
    mpi().allGatherInto(shard, whole, mpi().world());
    REQUIRE(at::equal(whole.to(at::kDouble), total));
  }
  if (rank == 1 || rank == 3) {
    at::Tensor shard = at::empty({2}, at::kDouble);
    mpi().reduceScatter(at::full({4}, double(rank), at::kDouble), shard, ReduceOp::Average,
                        Group({1, 3}));
    REQUIRE(at::equal(shard, at::full({2}, 2.0)));
    at::Tensor buffer = at::zeros({6}, at::kDouble);
    mpi().allGatherInto(at::full({2}, double(rank), at::kDouble), buffer.narrow(0, 1, 4),
                        Group({1, 3}));
    REQUIRE(at::equal(buffer, at::tensor({0.0, 1.0, 1.0, 3.0, 3.0, 0.0}, at::kDouble)));
  }
  mpi().barrier(mpi().world());
}

TEST_CASE("MPI size mismatches are CommErrors", "[comm][mpi]") {
  if (mpi().rank() == 0) {
    mpi().send(at::ones({3}), 1, 50);  // fewer elements than the receiver expects
    mpi().send(at::ones({8}), 1, 51);  // more elements than the receiver's buffer
  } else if (mpi().rank() == 1) {
    REQUIRE_THROWS_WITH(mpi().recv(at::empty({5}), 0, 50),
                        Catch::Contains("expected 5 elements") && Catch::Contains("received 3"));
    REQUIRE_THROWS_AS(mpi().recv(at::empty({4}), 0, 51), CommError);
  }
  mpi().barrier(mpi().world());
}

TEST_CASE("MPI recv from a rank that never sends times out naming it", "[comm][mpi]") {
  CommOptions options;
  options.timeoutSeconds = 0.5;
  MpiBackend quick(options);  // collective: every rank constructs it
  if (quick.rank() == 0) {
    REQUIRE_THROWS_AS(quick.recv(at::empty({4}), 1, 77), CommError);
    REQUIRE_THROWS_WITH(
        quick.recv(at::empty({4}), 1, 77),
        Catch::StartsWith(
            "rank 0 waited 0.5 s for a tensor from rank 1 (tag 77, recv of Float[4])"));
  }
  // Only then does rank 1 send: the cancelled receives must not swallow later traffic on the
  // same pair and tag.
  mpi().barrier(mpi().world());  // not `quick`: its 0.5 s would expire while rank 0 waits
  if (quick.rank() == 1) quick.send(at::full({4}, 5.0), 0, 77);
  if (quick.rank() == 0) {
    at::Tensor later = at::empty({4});
    quick.recv(later, 1, 77);
    REQUIRE(at::equal(later, at::full({4}, 5.0)));
  }
  mpi().barrier(mpi().world());
}
