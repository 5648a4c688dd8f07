#include "staging/sample_range.h"

#include <algorithm>

#include "core/error.h"

namespace autostage::staging {

SampleRange SampleRange::intersect(const SampleRange& other) const {
  int64_t lo = std::max(begin, other.begin);
  int64_t hi = std::min(end, other.end);
  return hi > lo ? SampleRange{lo, hi} : SampleRange{lo, lo};
}

std::string SampleRange::toString() const {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

SampleRange splitPart(const SampleRange& range, int parts, int index) {
  AUTOSTAGE_INTERNAL_ASSERT(parts >= 1 && index >= 0 && index < parts, "part ", index, " of ",
                            parts);
  int64_t n = range.size();
  return {range.begin + n * index / parts, range.begin + n * (index + 1) / parts};
}

BatchLayout::BatchLayout(int64_t localBatch, int worldSize, int microBatchCount)
    : localBatch_(localBatch), worldSize_(worldSize), microBatchCount_(microBatchCount) {
  AUTOSTAGE_CHECK(localBatch >= 1, "every rank must pass a batch of at least 1 sample, got ",
                  localBatch, "; check the size of dim 0 of the inputs");
  AUTOSTAGE_CHECK(worldSize >= 1, "world size must be >= 1, got ", worldSize);
  AUTOSTAGE_CHECK(microBatchCount >= 1 && microBatchCount <= globalBatch(),
                  "the micro-batch count must be in 1..", globalBatch(),
                  " (the global batch), got ", microBatchCount,
                  "; lower micro_batch_count or raise the batch size");
}

SampleRange BatchLayout::rankRows(int rank) const {
  return {localBatch_ * rank, localBatch_ * (rank + 1)};
}

SampleRange BatchLayout::microBatch(int micro) const {
  return splitPart({0, globalBatch()}, microBatchCount_, micro);
}

SampleRange BatchLayout::replicaRows(int micro, int replica, int replicaCount) const {
  return splitPart(microBatch(micro), replicaCount, replica);
}

void BatchLayout::checkReplicaCount(int replicaCount, const std::string& stageName) const {
  int64_t smallest = globalBatch() / microBatchCount_;
  AUTOSTAGE_CHECK(smallest >= replicaCount, "stage ", stageName, " has ", replicaCount,
                  " replicas but the smallest micro-batch has only ", smallest,
                  " samples (global batch ", globalBatch(), ", ", microBatchCount_,
                  " micro-batches); every replica needs at least one sample: raise the batch "
                  "size or plan with fewer micro-batches or replicas");
}

}  // namespace autostage::staging
