#include "core/pipeline_schedule.h"

#include <catch2/catch.hpp>

#include <set>
#include <tuple>

#include "core/error.h"

using namespace autostage;
using namespace autostage::core;

namespace {

// Runs every position's order with unit-time operations, async sends and blocking receives:
// F(k, m) waits for F(j, m) of *every* stage j < k, B(k, m) for B(j, m) of every j > k and for
// F(k, m) (Note [Pipeline schedules]). Returns the number of rounds, or -1 on a deadlock.
int replay(const std::string& schedule, int positions, int chunks, int micros) {
  const int stages = positions * chunks;
  std::vector<std::vector<PipelineOp>> orders;
  for (int p = 0; p < positions; ++p)
    orders.push_back(pipelineOrder(schedule, p, positions, chunks, micros));
  std::vector<std::vector<bool>> forwardDone(stages, std::vector<bool>(micros, false));
  std::vector<std::vector<bool>> backwardDone = forwardDone;
  std::vector<size_t> next(positions, 0);
  int rounds = 0;
  for (size_t finished = 0; finished < size_t(positions);) {
    // Each round, every position runs its next operation if its inputs exist (seen as of the
    // round's start, so a chain does not complete in one round).
    std::vector<std::tuple<int, int, bool>> done;
    finished = 0;
    for (int p = 0; p < positions; ++p) {
      if (next[p] == orders[p].size()) {
        ++finished;
        continue;
      }
      const PipelineOp op = orders[p][next[p]];
      const int stage = op.chunk * positions + p;
      bool ready = true;
      if (op.forward) {
        for (int j = 0; j < stage; ++j) ready = ready && forwardDone[j][op.microBatch];
      } else {
        ready = forwardDone[stage][op.microBatch];
        for (int j = stage + 1; j < stages; ++j) ready = ready && backwardDone[j][op.microBatch];
      }
      if (ready) done.emplace_back(stage, op.microBatch, op.forward);
    }
    if (finished == size_t(positions)) break;
    if (done.empty()) return -1;
    for (auto [stage, micro, forward] : done) {
      (forward ? forwardDone : backwardDone)[stage][micro] = true;
      ++next[stage % positions];
    }
    ++rounds;
  }
  return rounds;
}

}  // namespace

TEST_CASE("every order runs each operation of its chunks exactly once", "[core]") {
  for (int positions = 2; positions <= 6; ++positions)
    for (int chunks : {1, 2, 4})
      for (int micros = positions; micros <= 3 * positions; micros += positions)
        for (int p = 0; p < positions; ++p) {
          auto order = pipelineOrder("1f1b", p, positions, chunks, micros);
          std::set<std::tuple<bool, int, int>> seen;
          for (const PipelineOp& op : order) seen.emplace(op.forward, op.chunk, op.microBatch);
          REQUIRE(order.size() == size_t(2 * chunks * micros));
          REQUIRE(seen.size() == order.size());
          // A backward never precedes its own forward.
          for (size_t i = 0; i < order.size(); ++i)
            if (!order[i].forward)
              for (size_t j = i + 1; j < order.size(); ++j)
                REQUIRE(!(order[j].forward && order[j].chunk == order[i].chunk &&
                          order[j].microBatch == order[i].microBatch));
        }
}

TEST_CASE("v = 1 keeps the classic gpipe and 1f1b orders", "[core]") {
  using Op = PipelineOp;
  // 1f1b, 3 positions, 4 micro-batches, position 0: two warm-up forwards.
  std::vector<Op> expected{{true, 0, 0},  {true, 0, 1},  {true, 0, 2},  {false, 0, 0},
                           {true, 0, 3},  {false, 0, 1}, {false, 0, 2}, {false, 0, 3}};
  REQUIRE(pipelineOrder("1f1b", 0, 3, 1, 4) == expected);
  // The last position alternates from the start.
  expected = {{true, 0, 0}, {false, 0, 0}, {true, 0, 1}, {false, 0, 1}};
  REQUIRE(pipelineOrder("1f1b", 1, 2, 1, 2) == expected);
  expected = {{true, 0, 0}, {true, 0, 1}, {false, 0, 0}, {false, 0, 1}};
  REQUIRE(pipelineOrder("gpipe", 1, 2, 1, 2) == expected);
  REQUIRE(pipelineWarmup("1f1b", 0, 8, 1, 3) == 3);  // capped at M
}

TEST_CASE("interleaved 1f1b follows Megatron's chunk order", "[core]") {
  // 2 positions, 2 chunks, 4 micro-batches, position 0: warm-up (2-0-1)*2 + (2-1)*2 = 4
  // forwards: micro-batches 0, 1 of chunk 0, then 0, 1 of chunk 1; backwards start with chunk 1.
  auto order = pipelineOrder("1f1b", 0, 2, 2, 4);
  REQUIRE(pipelineWarmup("1f1b", 0, 2, 2, 4) == 4);
  REQUIRE(pipelineWarmup("1f1b", 1, 2, 2, 4) == 2);
  using Op = PipelineOp;
  std::vector<Op> head(order.begin(), order.begin() + 7);
  std::vector<Op> expected{{true, 0, 0}, {true, 0, 1},  {true, 1, 0}, {true, 1, 1},
                           {true, 0, 2}, {false, 1, 0}, {true, 0, 3}};
  REQUIRE(head == expected);
  REQUIRE(order.back() == Op{false, 0, 3});
  // M == S: every forward first.
  REQUIRE(pipelineWarmup("1f1b", 1, 4, 2, 4) == 8);
}

TEST_CASE("no schedule deadlocks, even with routes skipping stages", "[core]") {
  for (int positions = 2; positions <= 8; ++positions)
    for (int chunks : {1, 2, 4})
      for (int micros = 1; micros <= 4 * positions; ++micros) {
        if (!pipelineShapeProblem("1f1b", positions, chunks, micros).empty()) continue;
        INFO("S=" << positions << " v=" << chunks << " M=" << micros);
        REQUIRE(replay("1f1b", positions, chunks, micros) > 0);
        if (chunks == 1) REQUIRE(replay("gpipe", positions, chunks, micros) > 0);
      }
}

TEST_CASE("interleaving shortens the pipeline of equal stages", "[core]") {
  // Unit-time operations: a v = 2 chunk holds half a stage, so one of its rounds is half a
  // v = 1 round. 4 positions, 8 micro-batches: 1f1b takes 2 (M + S - 1) = 22 rounds; the
  // interleaved order must take fewer than 2 x 22 half-length rounds.
  const int plain = replay("1f1b", 4, 1, 8);
  const int interleaved = replay("1f1b", 4, 2, 8);
  REQUIRE(plain == 2 * (8 + 4 - 1));
  REQUIRE(interleaved < 2 * plain);
}

TEST_CASE("shapes the runtime cannot run are named", "[core]") {
  REQUIRE_THAT(pipelineShapeProblem("1f1b", 4, 2, 6),
               Catch::Contains("6 micro-batches is not a multiple of 4"));
  REQUIRE_THAT(pipelineShapeProblem("gpipe", 2, 2, 4), Catch::Contains("schedule=1f1b"));
  REQUIRE_THAT(pipelineShapeProblem("1f1b", 1, 2, 4), Catch::Contains("at least 2 pipeline"));
  REQUIRE_THAT(pipelineShapeProblem("zigzag", 2, 1, 4), Catch::Contains("unknown"));
  REQUIRE(pipelineShapeProblem("1f1b", 4, 4, 8).empty());
  REQUIRE_THROWS_AS(pipelineOrder("1f1b", 0, 4, 2, 6), PlanError);
}
