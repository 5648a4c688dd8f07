#pragma once
// Grouping point-to-point operations that may meet in both directions (Note [Grouped
// point-to-point]). Torch- and CUDA-free, so the rule is unit-tested on machines without NCCL.

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace autostage::comm {

// Note [Grouped point-to-point]
// NCCL queues a send or a receive as a kernel on the backend's stream; a send finishes only when
// the peer's matching receive runs. In the steady state of 1F1B, a rank sends activations to the
// next stage and receives gradients from it, while that rank sends gradients back and receives
// the activations: launched one by one on one stream, each rank's receive waits behind its own
// send, which waits for the other's receive -- a deadlock. Launched inside one
// ncclGroupStart/ncclGroupEnd, NCCL progresses them together. So the NCCL backend launches its
// point-to-point operations lazily: isend/irecv queue them, and the first wait (or completion
// poll) on any of them, or any collective, launches everything queued so far, in posting order,
// as one group. Every operation a rank posts before it blocks is in the group it blocks on, so
// transfers that meet in both directions always share a group, whatever order the schedule
// posts them in; per-peer order is posting order, as NCCL's matching needs. The MPI and thread
// backends need none of this: their non-blocking calls progress independently.
template <typename Done>
class P2pGrouper {
 public:
  // The operations posted between two launches; each work item keeps its batch.
  class Batch {
   public:
    bool launched() const { return done_.has_value(); }
    // Completion of the whole group; only after launched().
    const Done& done() const { return *done_; }

   private:
    friend class P2pGrouper;
    std::vector<std::function<void()>> operations_;
    std::optional<Done> done_;
  };

  // Queues `launch` (e.g. one ncclSend) in the open batch and returns that batch.
  std::shared_ptr<Batch> post(std::function<void()> launch) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!open_) open_ = std::make_shared<Batch>();
    open_->operations_.push_back(std::move(launch));
    return open_;
  }

  // Launches the open batch, when there is one: start() (ncclGroupStart), every queued operation
  // in posting order, then end() (ncclGroupEnd), whose result is the batch's completion. A new
  // batch opens with the next post. The operations (and what they hold, e.g. their tensors) stay
  // with the batch until its last work lets it go. An exception leaves the batch unlaunched and
  // closed (its works report the error when they wait: they find it not launched).
  void launch(const std::function<void()>& start, const std::function<Done()>& end) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!open_) return;
    std::shared_ptr<Batch> batch = std::move(open_);
    open_.reset();
    start();
    for (const auto& operation : batch->operations_) operation();
    batch->done_ = end();
  }

  // Operations queued and not launched yet.
  size_t pending() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return open_ ? open_->operations_.size() : 0;
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<Batch> open_;
};

}  // namespace autostage::comm
