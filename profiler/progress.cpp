#include "profiler/progress.h"

#include <algorithm>
#include <cstdio>

#include <unistd.h>

#include "core/log.h"

namespace autostage::profiler {
namespace {

constexpr int kBarWidth = 30;

int64_t logStep(int64_t total) { return std::max<int64_t>(1, total / 10); }

}  // namespace

ProgressReporter::ProgressReporter(int64_t total, std::string what, bool bar)
    : total_(std::max<int64_t>(total, 0)),
      nextLog_(logStep(total)),
      what_(std::move(what)),
      bar_(bar && isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()) {}

ProgressReporter::~ProgressReporter() { clearBar(); }

double ProgressReporter::elapsedSeconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressReporter::advance(int64_t count) {
  done_ += count;
  if (done_ >= nextLog_ || done_ == total_) {
    clearBar();  // keep log lines off the bar's line
    core::logger("Profiler")->info("profiled {}/{} {}", done_, total_, what_);
    while (nextLog_ <= done_) nextLog_ += logStep(total_);
  }
  if (bar_) drawBar();
}

void ProgressReporter::drawBar() {
  int filled = total_ > 0 ? static_cast<int>(kBarWidth * std::min(done_, total_) / total_) : 0;
  std::string bar(filled, '#');
  bar.resize(kBarWidth, ' ');
  std::fprintf(stderr, "\r[Profiler] [%s] %lld/%lld %s %.1fs", bar.c_str(),
               static_cast<long long>(done_), static_cast<long long>(total_), what_.c_str(),
               elapsedSeconds());
  std::fflush(stderr);
  barDrawn_ = true;
}

void ProgressReporter::clearBar() {
  if (!barDrawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  barDrawn_ = false;
}

void ProgressReporter::finish(const std::string& summary) {
  clearBar();
  bar_ = false;
  core::logger("Profiler")->info("{} in {:.1f} s", summary, elapsedSeconds());
}

}  // namespace autostage::profiler
