#include "staging/sample_range.h"

#include "catch_torch.h"

#include "core/error.h"

namespace autostage::staging {
namespace {

TEST_CASE("splitPart cuts a range into contiguous near-equal parts that cover it", "[staging]") {
  SampleRange range{3, 13};  // 10 rows
  std::vector<int64_t> sizes;
  int64_t next = range.begin;
  for (int i = 0; i < 4; ++i) {
    SampleRange part = splitPart(range, 4, i);
    CHECK(part.begin == next);
    next = part.end;
    sizes.push_back(part.size());
  }
  CHECK(next == range.end);
  CHECK(sizes == std::vector<int64_t>{2, 3, 2, 3});
}

TEST_CASE("intersections of sample ranges", "[staging]") {
  CHECK(SampleRange{0, 8}.intersect({4, 12}) == SampleRange{4, 8});
  CHECK(SampleRange{0, 4}.intersect({4, 12}).empty());
  CHECK(SampleRange{5, 6}.intersect({0, 12}) == SampleRange{5, 6});
}

TEST_CASE("batch layout: ranks, micro-batches and replica slices", "[staging]") {
  BatchLayout layout(/*localBatch=*/3, /*worldSize=*/4, /*microBatchCount=*/2);
  CHECK(layout.globalBatch() == 12);
  CHECK(layout.rankRows(2) == SampleRange{6, 9});
  CHECK(layout.microBatch(0) == SampleRange{0, 6});
  CHECK(layout.microBatch(1) == SampleRange{6, 12});
  CHECK(layout.replicaRows(1, 0, 2) == SampleRange{6, 9});
  CHECK(layout.replicaRows(1, 1, 2) == SampleRange{9, 12});
  CHECK(layout.replicaRows(0, 2, 3) == SampleRange{4, 6});
}

TEST_CASE("a layout refuses empty batches and empty replica slices", "[staging]") {
  CHECK_THROWS_WITH(BatchLayout(0, 4, 1), Catch::Contains("at least 1 sample"));
  CHECK_THROWS_WITH(BatchLayout(1, 2, 3), Catch::Contains("micro-batch count must be in 1..2"));
  BatchLayout layout(1, 4, 2);  // micro-batches of 2 rows
  CHECK_NOTHROW(layout.checkReplicaCount(2, "STAGE_0"));
  CHECK_THROWS_WITH(layout.checkReplicaCount(3, "STAGE_1"),
                    Catch::Contains("STAGE_1 has 3 replicas") && Catch::Contains("only 2"));
}

}  // namespace
}  // namespace autostage::staging
