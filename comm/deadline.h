#pragma once
// Deadlines for blocking waits, and the one wording of a timeout error.

#include <chrono>
#include <string>

namespace autostage::comm {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(double seconds)
      : seconds_(seconds),
        when_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(seconds))) {}
  bool expired() const { return Clock::now() >= when_; }
  Clock::time_point when() const { return when_; }
  double seconds() const { return seconds_; }

 private:
  double seconds_;
  Clock::time_point when_;
};

// "rank R waited S s for WHAT: <why and what to do>". `what` says whom and in which operation,
// e.g. "a tensor from rank 1 (tag 7, recv)".
std::string timeoutMessage(int rank, double seconds, const std::string& what);

}  // namespace autostage::comm
