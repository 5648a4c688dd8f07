// trace_events: 4 in-process ranks (thread backend) train a loss model under 1f1b (trainStep) and
// gpipe (forward + backward); every rank's trace file is valid Chrome-trace JSON (read with the
// reader `autostage report --trace` uses) and covers every stage's forward and backward of every
// micro-batch, on the ranks running that stage.
#include "staging/event_trace.h"

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "bindings/cli/measured_trace.h"
#include "comm/thread_backend.h"
#include "staging/module.h"
#include "test_support.h"

namespace autostage::staging {
namespace {

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
  std::filesystem::remove_all(dir);
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
    REQUIRE(std::filesystem::exists(path));
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
  const std::string dir = (std::filesystem::temp_directory_path() / "autostage_event_trace_test").string();
  for (const char* schedule : {"1f1b", "gpipe"}) {
    INFO(schedule);
    checkCoverage(trainTraced(schedule, dir));
    // One step of the measured timeline, as `autostage report --trace DIR` shows it.
    cli::MeasuredTrace last = cli::loadMeasuredTrace(dir);
    REQUIRE(last.step == kSteps - 1);
    REQUIRE(last.ranks == std::vector<int>{0, 1, 2, 3});
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("event trace file: bounded to the last steps, rewritten at every step end", "[staging]") {
  const std::string dir = (std::filesystem::temp_directory_path() / "autostage_event_trace_unit").string();
  std::filesystem::remove_all(dir);
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
  std::filesystem::remove_all(dir);
}

}  // namespace autostage::staging
