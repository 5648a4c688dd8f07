#pragma once
// Moves the rows of one Transfer between ranks: a non-blocking send (or, when sender and
// receiver are the same rank, a local mailbox) and a blocking receive into a slice of the
// receiver's buffer. Sends are kept until they complete (or waitAll()), so sent tensors stay
// alive and no rank blocks on a send (receives are the only blocking point, which keeps the
// schedules free of send/send deadlocks under MPI's rendezvous protocol).

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/backend.h"
#include "staging/transfer_plan.h"

namespace autostage::staging {

enum class Direction { Forward, Gradient };  // gradient messages use tag + 1, dst -> src

class RowTransport {
 public:
  explicit RowTransport(comm::Backend& backend) : backend_(backend) {}

  // Sends rows t.rows of `holder`, whose row 0 is global row `holderBegin`.
  void send(const at::Tensor& holder, int64_t holderBegin, const Transfer& t, Direction d);
  // Receives rows t.rows into `buffer`, whose row 0 is global row `bufferBegin`.
  void receive(const at::Tensor& buffer, int64_t bufferBegin, const Transfer& t, Direction d);
  // Forgets the sends that have completed (their rows are freed). Called by send().
  void releaseCompleted();
  // Waits for every pending send; throws CommError from the backend on failure.
  void waitAll();
  // Drops pending state after an error.
  void reset();

 private:
  comm::Backend& backend_;
  std::vector<std::unique_ptr<comm::Work>> pending_;
  std::map<std::pair<int, int>, at::Tensor> mailbox_;  // (tag, route) -> rows, local transfers
};

}  // namespace autostage::staging
