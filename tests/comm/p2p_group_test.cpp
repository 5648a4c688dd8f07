// Note [Grouped point-to-point]: the NCCL backend's lazy grouping, tested without NCCL. A small
// model of NCCL's semantics (one stream per rank runs its launched groups in order; a group
// finishes once every send and receive in it has its counterpart running on the peer) shows
// 1F1B's crossing transfers deadlock when each operation is launched alone and finish when
// P2pGrouper groups what a rank posted before it blocks.
#include "comm/p2p_group.h"

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch_torch.h"

using namespace autostage::comm;

namespace {

struct Op {
  bool send;
  int peer;
};

// Ranks' streams of launched groups (each group: ops in posting order). NCCL matches a rank's
// k-th send to a peer with the peer's k-th receive from it; a group runs when it heads its
// rank's stream, and finishes when every op's counterpart is in a running group.
class StreamModel {
 public:
  explicit StreamModel(int ranks) : streams_(ranks) {}
  void launch(int rank, std::vector<Op> group) { streams_[rank].push_back(std::move(group)); }
  // Runs until nothing more can finish; true when every launched group finished.
  bool drain() {
    for (bool progress = true; progress;) {
      progress = false;
      std::vector<std::map<std::string, int>> running(streams_.size());
      for (size_t r = 0; r < streams_.size(); ++r)
        if (!streams_[r].empty()) running[r] = count(streams_[r].front());
      for (size_t r = 0; r < streams_.size(); ++r) {
        if (streams_[r].empty()) continue;
        bool matched = true;
        for (const Op& op : streams_[r].front()) {
          std::string mirror = (op.send ? "recv<" : "send>") + std::to_string(r);
          std::string mine = (op.send ? "send>" : "recv<") + std::to_string(op.peer);
          if (running[op.peer][mirror] < running[r][mine]) matched = false;
        }
        if (matched) done_.push_back(static_cast<int>(r));
      }
      for (int r : done_) {
        streams_[r].erase(streams_[r].begin());
        progress = true;
      }
      done_.clear();
    }
    for (const auto& stream : streams_)
      if (!stream.empty()) return false;
    return true;
  }

 private:
  static std::map<std::string, int> count(const std::vector<Op>& group) {
    std::map<std::string, int> n;
    for (const Op& op : group) ++n[(op.send ? "send>" : "recv<") + std::to_string(op.peer)];
    return n;
  }
  std::vector<std::vector<std::vector<Op>>> streams_;
  std::vector<int> done_;
};

// 1F1B's steady state between stages 0 and 1: rank 0 sends activations of micro-batch m+1 and
// then waits for the gradient of m; rank 1 sends that gradient and then waits for the
// activations. `grouped`: through P2pGrouper (launched when the rank blocks); else each
// operation is launched as it is posted.
bool crossingTransfersFinish(bool grouped) {
  StreamModel model(2);
  std::vector<P2pGrouper<int>> groupers(2);
  std::vector<std::vector<Op>> open(2);
  auto post = [&](int rank, Op op) {
    if (!grouped) return model.launch(rank, {op});
    groupers[rank].post([&, rank, op] { open[rank].push_back(op); });
  };
  auto block = [&](int rank) {  // a wait: launch what the rank queued
    if (!grouped) return;
    groupers[rank].launch([&] { open[rank].clear(); },
                          [&] {
                            model.launch(rank, open[rank]);
                            return 0;
                          });
  };
  post(0, {true, 1});   // rank 0: activations to rank 1
  post(0, {false, 1});  // rank 0: the gradient from rank 1
  post(1, {true, 0});   // rank 1: the gradient to rank 0
  post(1, {false, 0});  // rank 1: activations from rank 0
  block(0);
  block(1);
  return model.drain();
}

}  // namespace

TEST_CASE("grouped point-to-point: crossing 1F1B transfers deadlock one by one, finish grouped",
          "[comm]") {
  CHECK_FALSE(crossingTransfersFinish(false));
  CHECK(crossingTransfersFinish(true));
}

TEST_CASE("grouped point-to-point: posting order, one launch per batch, a new batch after it",
          "[comm]") {
  P2pGrouper<int> grouper;
  std::vector<std::string> log;
  int launches = 0;
  auto start = [&] { log.push_back("start"); };
  auto end = [&] {
    log.push_back("end");
    return ++launches;
  };
  grouper.launch(start, end);  // nothing queued: nothing launched
  CHECK(log.empty());
  auto a = grouper.post([&] { log.push_back("send 1"); });
  auto b = grouper.post([&] { log.push_back("recv 1"); });
  CHECK(a == b);  // one batch
  CHECK(grouper.pending() == 2);
  CHECK_FALSE(a->launched());
  grouper.launch(start, end);
  CHECK(log == std::vector<std::string>{"start", "send 1", "recv 1", "end"});
  REQUIRE(a->launched());
  CHECK(a->done() == 1);
  CHECK(grouper.pending() == 0);
  grouper.launch(start, end);  // launched already: a second wait launches nothing
  CHECK(log.size() == 4);
  auto c = grouper.post([&] { log.push_back("send 2"); });
  CHECK(c != a);
  CHECK_FALSE(c->launched());
  grouper.launch(start, end);
  CHECK(c->done() == 2);
  CHECK(log.back() == "end");
  // A failing launch closes the batch unlaunched; the next post opens a new one.
  auto d = grouper.post([] { throw std::runtime_error("ncclSend failed"); });
  CHECK_THROWS_WITH(grouper.launch(start, end), "ncclSend failed");
  CHECK_FALSE(d->launched());
  CHECK(grouper.pending() == 0);
  CHECK(grouper.post([] {}) != d);
}
