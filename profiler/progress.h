#pragma once
// Progress of a long profiling run: an info line per tenth of the work
// (`[Profiler] [info] profiled 120/850 nodes`), a live bar on stderr when it is a terminal,
// and a summary line with the total time. Torch-free.

#include <chrono>
#include <cstdint>
#include <string>

namespace autostage::profiler {

class ProgressReporter {
 public:
  // `what` names the counted items ("nodes"); the bar is drawn only if `bar` and stderr is a tty.
  ProgressReporter(int64_t total, std::string what, bool bar);
  ~ProgressReporter();  // clears a drawn bar
  void advance(int64_t count = 1);
  int64_t done() const { return done_; }
  double elapsedSeconds() const;
  // Logs `<summary> in <seconds> s` and clears the bar.
  void finish(const std::string& summary);

 private:
  void drawBar();
  void clearBar();

  int64_t total_;
  int64_t done_ = 0;
  int64_t nextLog_;
  std::string what_;
  bool bar_;
  bool barDrawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace autostage::profiler
