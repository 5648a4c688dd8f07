#pragma once
// Sample ranges: which rows of the global batch a rank, micro-batch or stage replica holds.
//
// Note [Sample ranges]
// Every rank passes a local batch of the same size b; the global batch (size B = W·b) is their
// concatenation in rank order, so rank r feeds rows [r·b, (r+1)·b). Micro-batch m covers rows
// [B·m/M, B·(m+1)/M) (integer division; sizes differ by at most one). Replica i of a stage with R
// replicas holds the i-th of the R near-equal contiguous parts of each micro-batch. Every transfer
// of a batch value moves the intersection of the sender's and the receiver's ranges (see
// transfer_plan.h), so one rule serves feeder -> stage, stage -> stage and stage -> caller.
// Pure arithmetic: no torch.

#include <cstdint>
#include <string>
#include <vector>

namespace autostage::staging {

// Half-open row range [begin, end) of the global batch.
struct SampleRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  // Rows in both; empty (begin == end) when disjoint.
  SampleRange intersect(const SampleRange& other) const;
  std::string toString() const;  // `[4, 8)`
  bool operator==(const SampleRange& o) const { return begin == o.begin && end == o.end; }
};

// Part `index` of `range` cut into `parts` near-equal contiguous pieces.
SampleRange splitPart(const SampleRange& range, int parts, int index);

// The batch geometry of one step.
class BatchLayout {
 public:
  // Throws Error when a size is < 1 or a micro-batch replica slice would be empty.
  BatchLayout(int64_t localBatch, int worldSize, int microBatchCount);

  int64_t localBatch() const { return localBatch_; }
  int64_t globalBatch() const { return localBatch_ * worldSize_; }
  int worldSize() const { return worldSize_; }
  int microBatchCount() const { return microBatchCount_; }

  // Rows fed by (and returned to) `rank`.
  SampleRange rankRows(int rank) const;
  SampleRange microBatch(int micro) const;
  // Rows replica `replica` of a stage with `replicaCount` replicas holds in micro-batch `micro`.
  SampleRange replicaRows(int micro, int replica, int replicaCount) const;
  // Throws Error naming the stage when replicaCount replicas would get an empty slice.
  void checkReplicaCount(int replicaCount, const std::string& stageName) const;

 private:
  int64_t localBatch_;
  int worldSize_;
  int microBatchCount_;
};

}  // namespace autostage::staging
