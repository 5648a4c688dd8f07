#include "staging/transfer_plan.h"

#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

#include "catch_torch.h"

namespace autostage::staging {
namespace {

// Stage 0 on ranks {0,1} (reads model input value 0), stage 1 on rank {2}, value 5 goes from
// stage 0 to stage 1, value 9 from stage 1 to the caller.
core::Deployment twoStages() {
  core::Deployment d;
  d.worldSize = 4;
  d.microBatchCount = 2;
  d.stages = {{0, "STAGE_0", {0}, {0, 1}}, {1, "STAGE_1", {1}, {2}}};
  d.routes = {{0, core::kFeederStage, {0}, false, false},
              {5, 0, {1}, false, true},
              {9, 1, {}, true, true}};
  return d;
}

// Reference: for every receiver piece and every row in it, exactly one transfer delivers it,
// and it comes from the holder whose own range contains the row.
void checkEveryRowArrivesOnce(const TransferPlan& plan, int route, int dstStage, int dstRank,
                              int micro, SampleRange wanted) {
  std::vector<int> hits(wanted.size(), 0);
  for (const Transfer& t : plan.transfers()) {
    if (t.route != route || t.dstStage != dstStage || t.dstRank != dstRank || t.micro != micro)
      continue;
    CHECK(t.dstRows == wanted);
    for (int64_t row = t.rows.begin; row < t.rows.end; ++row) {
      REQUIRE(row >= wanted.begin);
      REQUIRE(row < wanted.end);
      CHECK(row >= t.srcRows.begin);
      CHECK(row < t.srcRows.end);
      ++hits[row - wanted.begin];
    }
  }
  for (int64_t i = 0; i < wanted.size(); ++i) {
    INFO("route " << route << " micro " << micro << " rank " << dstRank << " row "
                  << wanted.begin + i);
    CHECK(hits[i] == 1);
  }
}

TEST_CASE("every needed row arrives exactly once, from the holder of that row", "[staging]") {
  BatchLayout layout(/*localBatch=*/3, /*worldSize=*/4, /*microBatchCount=*/2);  // B = 12
  TransferPlan plan(twoStages(), layout);
  for (int m = 0; m < 2; ++m) {
    for (int replica = 0; replica < 2; ++replica)
      checkEveryRowArrivesOnce(plan, 0, 0, replica, m, layout.replicaRows(m, replica, 2));
    checkEveryRowArrivesOnce(plan, 1, 1, 2, m, layout.microBatch(m));
    for (int rank = 0; rank < 4; ++rank)
      checkEveryRowArrivesOnce(plan, 2, -1, rank, m, layout.rankRows(rank).intersect(layout.microBatch(m)));
  }
}

TEST_CASE("feeder transfers of a 2-replica stage, spelled out", "[staging]") {
  BatchLayout layout(3, 4, 2);
  TransferPlan plan(twoStages(), layout);
  // Micro-batch 1 = rows [6,12): replica 0 (rank 0) needs [6,9) = rank 2's rows, replica 1
  // (rank 1) needs [9,12) = rank 3's rows.
  auto in0 = plan.incoming(0, 0, 1);
  REQUIRE(in0.size() == 1);
  CHECK(in0[0]->srcRank == 2);
  CHECK(in0[0]->rows == SampleRange{6, 9});
  auto in1 = plan.incoming(1, 0, 1);
  REQUIRE(in1.size() == 1);
  CHECK(in1[0]->srcRank == 3);
  // Micro-batch 0 = rows [0,6): replica 0 needs [0,3) from itself (a local copy).
  auto local = plan.incoming(0, 0, 0);
  REQUIRE(local.size() == 1);
  CHECK(local[0]->local());
}

TEST_CASE("tags are distinct per route, micro-batch and receiver kind", "[staging]") {
  BatchLayout layout(3, 4, 2);
  TransferPlan plan(twoStages(), layout);
  std::map<std::tuple<int, int, int>, int> tagOf;  // (route, micro, toCaller) -> tag
  std::set<int> tags;
  for (const Transfer& t : plan.transfers()) {
    auto key = std::make_tuple(t.route, t.micro, t.toCaller() ? 1 : 0);
    if (tagOf.count(key)) {
      CHECK(tagOf[key] == t.tag);
    } else {
      tagOf[key] = t.tag;
      CHECK(tags.insert(t.tag).second);
      CHECK(tags.count(t.tag + 1) == 0);
    }
    CHECK(t.tag % 2 == 0);
  }
}

TEST_CASE("an interleaved rank receiving one route for two stages gets distinct tags",
          "[staging]") {
  // 2 positions x 2 virtual stages: stages 0, 2 on rank 0 and 1, 3 on rank 1. Value 5 of stage 0
  // is read by stages 1 and 3, both on rank 1: two transfers 0 -> 1 per micro-batch.
  core::Deployment d;
  d.worldSize = 2;
  d.microBatchCount = 2;
  d.schedule = "1f1b";
  d.virtualStages = 2;
  d.stages = {{0, "STAGE_0", {0}, {0}}, {1, "STAGE_1", {1}, {1}}, {2, "STAGE_2", {2}, {0}},
              {3, "STAGE_3", {3}, {1}}};
  d.routes = {{0, core::kFeederStage, {0}, false, false}, {5, 0, {1, 3}, false, true},
              {7, 1, {2}, false, true}, {9, 3, {}, true, true}};
  BatchLayout layout(4, 2, 2);
  TransferPlan plan(d, layout);
  for (int micro = 0; micro < 2; ++micro) {
    auto toOne = plan.incoming(1, 1, micro);
    auto toThree = plan.incoming(1, 3, micro);
    REQUIRE(toOne.size() == 1);
    REQUIRE(toThree.size() == 1);
    CHECK(toOne[0]->srcRank == 0);
    CHECK(toThree[0]->srcRank == 0);
    CHECK(toOne[0]->tag != toThree[0]->tag);
    CHECK(std::abs(toOne[0]->tag - toThree[0]->tag) >= 2);  // gradients use tag + 1
  }
  std::set<std::pair<int, int>> seen;  // (sender, tag) is unique per receiver
  for (const Transfer& t : plan.transfers())
    CHECK(seen.insert({t.srcRank * 100000 + t.dstRank, t.tag}).second);
}

TEST_CASE("skipped routes get no transfers", "[staging]") {
  BatchLayout layout(3, 4, 1);
  TransferPlan plan(twoStages(), layout, {false, false, true});
  for (const Transfer& t : plan.transfers()) CHECK(t.route != 2);
}

TEST_CASE("a tensor-parallel stage: its first members send, every member receives, the first "
          "sends gradients back", "[staging]") {
  // Stage 0 on ranks {0,1}; stage 1 tensor-parallel: 2 replicas of 2 ranks, {2,3} and {4,5}.
  core::Deployment d;
  d.worldSize = 6;
  d.microBatchCount = 2;
  d.stages = {{0, "STAGE_0", {0}, {0, 1}}, {1, "STAGE_1", {1}, {2, 3, 4, 5}}};
  d.stages[1].tensorParallel = 2;
  d.routes = {{0, core::kFeederStage, {0}, false, false},
              {5, 0, {1}, false, true},
              {9, 1, {}, true, true}};
  BatchLayout layout(2, 6, 2);  // B = 12, micro-batches of 6 rows, 3 per replica
  TransferPlan plan(d, layout);
  for (int m = 0; m < 2; ++m) {
    for (int member = 0; member < 2; ++member) {
      checkEveryRowArrivesOnce(plan, 1, 1, 2 + member, m, layout.replicaRows(m, 0, 2));
      checkEveryRowArrivesOnce(plan, 1, 1, 4 + member, m, layout.replicaRows(m, 1, 2));
    }
    for (int rank = 0; rank < 6; ++rank)
      checkEveryRowArrivesOnce(plan, 2, -1, rank, m, layout.rankRows(rank).intersect(layout.microBatch(m)));
  }
  for (const Transfer& t : plan.transfers()) {
    INFO(plan.toString());
    if (t.srcStage == 1) CHECK((t.srcRank == 2 || t.srcRank == 4));  // the groups' first members
    if (t.dstStage == 1) CHECK(t.carriesGradient == (t.dstRank == 2 || t.dstRank == 4));
    if (t.dstStage != 1) CHECK(t.carriesGradient);
  }
  CHECK(plan.outgoing(3, 1, 0).empty());
  CHECK(plan.outgoing(5, 1, 1).empty());
}

}  // namespace
}  // namespace autostage::staging
