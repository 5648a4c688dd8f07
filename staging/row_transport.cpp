#include "staging/row_transport.h"

#include <algorithm>

#include "core/error.h"

namespace autostage::staging {

void RowTransport::send(const at::Tensor& holder, int64_t holderBegin, const Transfer& t,
                        Direction d) {
  at::Tensor rows =
      holder.detach().narrow(0, t.rows.begin - holderBegin, t.rows.size()).contiguous();
  int tag = t.tag + (d == Direction::Gradient ? 1 : 0);
  int peer = d == Direction::Forward ? t.dstRank : t.srcRank;
  if (t.local()) {
    bool fresh = mailbox_.emplace(std::make_pair(tag, t.route), rows).second;
    AUTOSTAGE_INTERNAL_ASSERT(fresh, "two local messages with tag ", tag, " for route ", t.route);
    return;
  }
  releaseCompleted();
  pending_.push_back(backend_.isend(rows, peer, tag));
}

// A completed send no longer needs its rows: dropping its Work frees them now instead of at
// waitAll() (the end of the step), so a stage does not hold every micro-batch's sent outputs
// and input gradients at once (measured by bench/memory_accuracy; Note [Measured memory]).
void RowTransport::releaseCompleted() {
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const std::unique_ptr<comm::Work>& work) {
                                  return work->isCompleted();
                                }),
                 pending_.end());
}

void RowTransport::receive(const at::Tensor& buffer, int64_t bufferBegin, const Transfer& t,
                           Direction d) {
  at::Tensor slice = buffer.narrow(0, t.rows.begin - bufferBegin, t.rows.size());
  int tag = t.tag + (d == Direction::Gradient ? 1 : 0);
  int peer = d == Direction::Forward ? t.srcRank : t.dstRank;
  if (t.local()) {
    auto it = mailbox_.find({tag, t.route});
    AUTOSTAGE_INTERNAL_ASSERT(it != mailbox_.end(), "local message with tag ", tag,
                              " for route ", t.route, " was received before it was sent");
    slice.copy_(it->second);
    mailbox_.erase(it);
    return;
  }
  AUTOSTAGE_INTERNAL_ASSERT(slice.is_contiguous(), "receive buffer slice is not contiguous");
  backend_.recv(slice, peer, tag);
}

void RowTransport::waitAll() {
  for (auto& work : pending_) work->wait();
  pending_.clear();
  AUTOSTAGE_INTERNAL_ASSERT(mailbox_.empty(), mailbox_.size(),
                            " local messages were sent but never received");
}

void RowTransport::reset() {
  pending_.clear();
  mailbox_.clear();
}

}  // namespace autostage::staging
