// trace_events: 4 in-process ranks (thread backend) train a loss model under 1f1b (trainStep) and
// gpipe (forward + backward); every rank's trace file is valid Chrome-trace JSON (read with the
// reader `autostage report --trace` uses) and covers every stage's forward and backward of every
// micro-batch, on the ranks running that stage. Unit tests: the file keeps the last steps, and
// each step's StepMemory is one peak_memory instant event (Note [Trace files]).
#include "staging/event_trace.h"

#include "catch_torch.h"
#include <torch/torch.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "bindings/cli/measured_trace.h"
#include "comm/thread_backend.h"
#include "core/file_system.h"
#include "driver/module.h"
#include "test_support.h"

namespace autostage::driver {
namespace {

using namespace staging;

constexpr int kWorld = 4, kMicroBatches = 3, kSteps = 3;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs kSteps steps on 4 thread ranks (stage 0 on ranks 0-1, stage 1 on 2, stage 2 on 3) and
// returns the events of every rank's trace file.
std::vector<cli::MeasuredEvent> trainTraced(const std::string& schedule, const std::string& dir) {
  core::removeAll(dir);
  std::vector<torch::jit::Module> models;
  for (int r = 0; r < kWorld; ++r) {
    torch::manual_seed(5);
    models.push_back(testing::makeLossMlp());
  }
  at::Tensor x = torch::randn({kWorld * 6, 8}), y = torch::randn({kWorld * 6, 4});
  testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& backend) {
    ModuleOptions options;
    options.backend = testing::borrow(backend);
    options.traceDirectory = dir;
    options.traceSteps = 2;
    options.planner = [&](const PlanningInput& in) {
      return testing::makeDeployment(in.model.graph, {{0, 1}, {2}, {3}}, in.worldSize, kMicroBatches,
                                     schedule);
    };
    Module module(models[backend.rank()], options);
    const int rank = backend.rank();
    std::vector<c10::IValue> batch{x.narrow(0, rank * 6, 6), y.narrow(0, rank * 6, 6)};
    for (int step = 0; step < kSteps; ++step) {
      if (schedule == "1f1b") {
        module.trainStep(batch);
      } else {
        module.forward(batch)[0].backward();
      }
    }
  }));
  std::vector<cli::MeasuredEvent> all;
  for (int r = 0; r < kWorld; ++r) {
    const std::string path = dir + "/trace_rank" + std::to_string(r) + ".json";
    REQUIRE(core::pathExists(path));
    std::vector<cli::MeasuredEvent> events = cli::parseChromeTrace(readFile(path), path);
    for (const cli::MeasuredEvent& e : events) REQUIRE(e.rank == r);
    all.insert(all.end(), events.begin(), events.end());
  }
  return all;
}

void checkCoverage(const std::vector<cli::MeasuredEvent>& events) {
  const std::vector<std::vector<int>> ranksOf = {{0, 1}, {2}, {3}};
  // (rank, name, micro-batch, step) of compute events; the file keeps the last 2 of 3 steps.
  std::set<std::tuple<int, std::string, int, long>> seen;
  for (const cli::MeasuredEvent& e : events) {
    REQUIRE(e.endSeconds >= e.startSeconds);
    REQUIRE((e.step == kSteps - 2 || e.step == kSteps - 1));
    if (e.name == "forward" || e.name == "backward") {
      REQUIRE(e.stage >= 0);
      REQUIRE(std::count(ranksOf[e.stage].begin(), ranksOf[e.stage].end(), e.rank) == 1);
      REQUIRE(seen.emplace(e.rank, e.name, e.microBatch, e.step).second);  // once each
    }
  }
  for (int s = 0; s < 3; ++s)
    for (int rank : ranksOf[s])
      for (long step : {long{kSteps - 2}, long{kSteps - 1}})
        for (int m = 0; m < kMicroBatches; ++m)
          for (const char* name : {"forward", "backward"}) {
            INFO("rank " << rank << " " << name << " micro-batch " << m << " step " << step);
            REQUIRE(seen.count({rank, name, m, step}) == 1);
          }
  REQUIRE(seen.size() == 4 * 2 * kMicroBatches * 2);
  std::set<int> allreduceRanks;
  for (const cli::MeasuredEvent& e : events)
    if (e.name == "allreduce") allreduceRanks.insert(e.rank);
  REQUIRE(allreduceRanks == std::set<int>{0, 1, 2, 3});  // every holder joins the gradient sync
}

}  // namespace

TEST_CASE("trace_events: every rank's Chrome trace covers its stage's forwards and backwards",
          "[staging]") {
  const std::string dir = core::joinPath(core::tempDirectory(), "autostage_event_trace_test");
  for (const char* schedule : {"1f1b", "gpipe"}) {
    INFO(schedule);
    checkCoverage(trainTraced(schedule, dir));
    // One step of the measured timeline, as `autostage report --trace DIR` shows it.
    cli::MeasuredTrace last = cli::loadMeasuredTrace(dir);
    REQUIRE(last.step == kSteps - 1);
    REQUIRE(last.ranks == std::vector<int>{0, 1, 2, 3});
  }
  core::removeAll(dir);
}

TEST_CASE("event trace file: bounded to the last steps, rewritten at every step end", "[staging]") {
  const std::string dir = core::joinPath(core::tempDirectory(), "autostage_event_trace_unit");
  core::removeAll(dir);
  EventTrace trace(3, dir, 2);
  for (int step = 0; step < 4; ++step) {
    trace.beginStep();
    trace.add("forward", 1, 0, 1000 * step, 1000 * step + 10);
    trace.endStep();
    std::vector<cli::MeasuredEvent> events = cli::parseChromeTrace(readFile(trace.path()), trace.path());
    REQUIRE(events.size() == static_cast<size_t>(std::min(step + 1, 2)));
    REQUIRE(events.back().step == step);
    REQUIRE(events.back().rank == 3);
    REQUIRE(events.back().endSeconds - events.back().startSeconds == Approx(10e-6));
  }
  REQUIRE(trace.path() == dir + "/trace_rank3.json");
  core::removeAll(dir);
}

TEST_CASE("event trace file: one peak_memory instant event per step, kept with its step", "[staging]") {
  const std::string dir = core::joinPath(core::tempDirectory(), "autostage_event_trace_memory");
  core::removeAll(dir);
  EventTrace trace(2, dir, 2);
  int64_t before = 0, after = 0;
  for (int step = 0; step < 3; ++step) {
    trace.beginStep();
    trace.add("forward", 1, 0, 1000 * step, 1000 * step + 10);
    StepMemory memory{99, 1, 0, 0, 0, 11, 12, 13, 14};
    trace.addMemory(memory);  // replaced by the second call of the step
    memory.measuredPeak = (int64_t{5} << 30) + step;  // past 32 bits
    memory.predicted = int64_t{4} << 30;
    memory.usable = int64_t{36} << 30;
    memory.transient = memory.measuredPeak - 11 - 12 - 13;
    before = EventTrace::nowMicros();
    trace.addMemory(memory);
    after = EventTrace::nowMicros();
    trace.endStep();
  }
  const std::string json = readFile(trace.path());
  INFO(json);
  // The exact line of the last step; "step" is the trace's step number, not StepMemory::step.
  std::smatch line;
  const std::regex lastPeak(R"(\{"name":"peak_memory","ph":"i","s":"p","ts":([0-9]+),[^\n]*"step":2,[^\n]*\}\})");
  REQUIRE(std::regex_search(json, line, lastPeak));
  const int64_t ts = std::stoll(line[1].str());
  REQUIRE(before <= ts);
  REQUIRE(ts <= after);
  REQUIRE(line[0].str() == "{\"name\":\"peak_memory\",\"ph\":\"i\",\"s\":\"p\",\"ts\":" + std::to_string(ts) +
                               ",\"pid\":2,\"tid\":0,\"args\":{\"step\":2,\"stage\":1,\"measured\":5368709122,"
                               "\"predicted\":4294967296,\"usable\":38654705664,\"parameters\":11,"
                               "\"gradients\":12,\"optimizer\":13,\"transient\":5368709086}}");
  // Read back: one record per kept step (step 0 dropped with its events), all fields.
  const cli::TraceRecords records = cli::parseTraceRecords(json, trace.path());
  REQUIRE(records.events.size() == 2);
  REQUIRE(records.memory.size() == 2);
  for (int i = 0; i < 2; ++i) {
    const cli::MeasuredMemory& m = records.memory[i];
    REQUIRE(m.rank == 2);
    REQUIRE(m.step == i + 1);
    REQUIRE(m.stage == 1);
    REQUIRE(m.measuredPeak == (int64_t{5} << 30) + i + 1);
    REQUIRE(m.predicted == int64_t{4} << 30);
    REQUIRE(m.usable == int64_t{36} << 30);
    REQUIRE(m.parameters == 11);
    REQUIRE(m.gradients == 12);
    REQUIRE(m.optimizer == 13);
    REQUIRE(m.transient == m.measuredPeak - 36);
  }
  REQUIRE(cli::loadMeasuredTrace(trace.path()).memory.size() == 1);  // the step shown
  core::removeAll(dir);
}

}  // namespace autostage::driver
