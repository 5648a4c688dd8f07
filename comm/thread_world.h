#pragma once
// The shared mailbox behind ThreadBackend: N threads in one process act as N ranks.
//
// Messages are keyed by (source, destination, tag, channel); the channel separates user
// point-to-point traffic ("") from each collective's internal traffic. Within one key, the k-th
// receive posted takes the k-th message sent, like MPI's non-overtaking rule. Thread-safe.

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <c10/core/ScalarType.h>

#include "comm/comm_options.h"
#include "comm/deadline.h"

namespace autostage::comm {

struct MailKey {
  int src;
  int dst;
  int tag;
  std::string channel;
  bool operator<(const MailKey& o) const {
    return std::tie(src, dst, tag, channel) < std::tie(o.src, o.dst, o.tag, o.channel);
  }
};

struct Mail {
  at::ScalarType dtype = at::kByte;
  int64_t numel = 0;
  std::vector<uint8_t> bytes;
};

class ThreadWorld {
 public:
  ThreadWorld(int worldSize, CommOptions options);

  int worldSize() const { return worldSize_; }
  const CommOptions& options() const { return options_; }

  void post(const MailKey& key, Mail mail);
  // Reserves the next receive slot for `key`; pass it to take().
  int64_t reserve(const MailKey& key);
  // The message for `ticket`, waiting until `deadline`; nullopt on timeout.
  std::optional<Mail> take(const MailKey& key, int64_t ticket, const Deadline& deadline);
  // The message for `ticket` if it has arrived; never blocks.
  std::optional<Mail> tryTake(const MailKey& key, int64_t ticket);

 private:
  struct Box {
    int64_t sent = 0;
    int64_t reserved = 0;
    std::map<int64_t, Mail> waiting;  // by send sequence number
  };
  std::optional<Mail> extract(Box& box, int64_t ticket);

  int worldSize_;
  CommOptions options_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<MailKey, Box> boxes_;
};

}  // namespace autostage::comm
