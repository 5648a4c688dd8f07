// Reading the peak_memory events of the runtime trace (Note [Trace files] in
// staging/event_trace.h): the fields, the step selection shared with the complete events, files
// without memory records, and damaged fields.
#include "bindings/cli/measured_trace.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "scratch_files.h"

using namespace autostage;
using namespace autostage::cli;

namespace {

std::string forward(int rank, long step, long ts) {
  return R"({"name":"forward","ph":"X","ts":)" + std::to_string(ts) + R"(,"dur":100,"pid":)" +
         std::to_string(rank) + R"(,"tid":0,"args":{"stage":)" + std::to_string(rank) +
         R"(,"micro_batch":0,"step":)" + std::to_string(step) + "}}";
}

// A peak_memory event as EventTrace writes it; `measured` is in MiB.
std::string peak(int rank, long step, int measuredMiB) {
  const int64_t mib = int64_t{1} << 20;
  return R"({"name":"peak_memory","ph":"i","s":"p","ts":5000,"pid":)" + std::to_string(rank) +
         R"(,"tid":0,"args":{"step":)" + std::to_string(step) + R"(,"stage":)" + std::to_string(rank) +
         R"(,"measured":)" + std::to_string(measuredMiB * mib) + R"(,"predicted":)" +
         std::to_string(100 * mib) + R"(,"usable":)" + std::to_string(int64_t{36} << 30) +
         R"(,"parameters":)" + std::to_string(10 * mib) + R"(,"gradients":)" + std::to_string(10 * mib) +
         R"(,"optimizer":)" + std::to_string(20 * mib) + R"(,"transient":)" +
         std::to_string((measuredMiB - 40) * mib) + "}}";
}

std::string trace(const std::vector<std::string>& events) {
  std::string json = "{\"traceEvents\":[\n";
  for (size_t i = 0; i < events.size(); ++i) json += (i ? ",\n" : "") + events[i];
  return json + "\n]}";
}

}  // namespace

TEST_CASE("measured trace: peak_memory events are read field by field", "[cli]") {
  const TraceRecords records = parseTraceRecords(trace({forward(1, 4, 1000), peak(1, 4, 130)}), "t");
  REQUIRE(records.events.size() == 1);
  REQUIRE(records.memory.size() == 1);
  const MeasuredMemory& m = records.memory[0];
  const int64_t mib = int64_t{1} << 20;
  REQUIRE(m.rank == 1);
  REQUIRE(m.step == 4);
  REQUIRE(m.stage == 1);
  REQUIRE(m.measuredPeak == 130 * mib);
  REQUIRE(m.predicted == 100 * mib);
  REQUIRE(m.usable == int64_t{36} << 30);  // above 2^32: read as a 64-bit integer
  REQUIRE(m.parameters == 10 * mib);
  REQUIRE(m.gradients == 10 * mib);
  REQUIRE(m.optimizer == 20 * mib);
  REQUIRE(m.transient == 90 * mib);
  // The events-only reader ignores it, as it ignores every other phase.
  REQUIRE(parseChromeTrace(trace({forward(1, 4, 1000), peak(1, 4, 130)}), "t").size() == 1);
}

TEST_CASE("measured trace: memory of the step shown, ascending rank - old files load without it", "[cli]") {
  // Rank 1 got one step further than rank 0: step 3 is the last every rank recorded.
  TraceRecords records = parseTraceRecords(
      trace({forward(1, 3, 1000), peak(1, 3, 150), forward(1, 4, 2000), peak(1, 4, 160),
             forward(0, 3, 1000), peak(0, 3, 120), peak(0, 2, 110), forward(0, 2, 500)}),
      "t");
  MeasuredTrace shown = selectLastStep(records.events, records.memory);
  REQUIRE(shown.step == 3);
  REQUIRE(shown.memory.size() == 2);
  REQUIRE(shown.memory[0].rank == 0);
  REQUIRE(shown.memory[0].measuredPeak == int64_t{120} << 20);
  REQUIRE(shown.memory[1].rank == 1);
  REQUIRE(shown.memory[1].measuredPeak == int64_t{150} << 20);
  // A file written before the peak_memory events existed.
  MeasuredTrace old = selectLastStep(parseChromeTrace(trace({forward(0, 3, 1000)}), "t"));
  REQUIRE(old.step == 3);
  REQUIRE(old.memory.empty());
  // Through loadMeasuredTrace: one file per rank, one of them without memory records.
  const auto dir = testing::scratchPath("measured_trace_test", "traces");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "trace_rank0.json") << trace({forward(0, 3, 1000)});
  std::ofstream(dir / "trace_rank1.json") << trace({forward(1, 3, 1000), peak(1, 3, 150)});
  MeasuredTrace loaded = loadMeasuredTrace(dir.string());
  REQUIRE(loaded.ranks == std::vector<int>{0, 1});
  REQUIRE(loaded.memory.size() == 1);
  REQUIRE(loaded.memory[0].rank == 1);
}

TEST_CASE("measured trace: a peak_memory field of the wrong type is a FormatError naming the file",
          "[cli]") {
  const std::string good = peak(2, 4, 130);
  const std::pair<std::string, std::string> damaged[] = {
      {"\"measured\":136314880", "\"measured\":\"136314880\""},  // a string
      {"\"usable\":38654705664", "\"usable\":1.5"},              // not an integer
      {"\"stage\":2,", ""},                                      // missing
      {"\"pid\":2", "\"pid\":null"}};
  for (const auto& [field, replacement] : damaged) {
    std::string event = good;
    const size_t at = event.find(field);
    REQUIRE(at != std::string::npos);
    event.replace(at, field.size(), replacement);
    INFO(event);
    const std::string key = field.substr(1, field.find('"', 1) - 1);
    const std::string json = trace({forward(2, 4, 1000), event});
    REQUIRE_THROWS_AS(parseTraceRecords(json, "'ranks.json'"), FormatError);
    REQUIRE_THROWS_WITH(parseTraceRecords(json, "'ranks.json'"),
                        Catch::Contains("'ranks.json': traceEvents[1] (peak_memory)") &&
                            Catch::Contains("\"" + key + "\""));
  }
  // Other instant events are not ours to check.
  REQUIRE(parseTraceRecords(trace({R"({"name":"mark","ph":"i","args":{"measured":"x"}})"}), "t").memory.empty());
}
