#include "bindings/cli/report_html.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <vector>

#include "bindings/cli/deployment_view.h"
#include "bindings/cli/measured_trace.h"
#include "bindings/cli/report_command.h"
#include "bindings/cli/svg.h"
#include "core/error.h"
#include "core/proto/deployment_file.h"
#include "core/proto/file_format.h"
#include "scratch_files.h"

using namespace autostage;
using namespace autostage::cli;

namespace {

// 3 stages on 8 ranks, 4 per node: stage 0 on ranks 0-3, stage 1 on 4-5, stage 2 on 6; rank 7 idle.
core::Deployment sample() {
  core::Deployment d;
  d.graphHash = "0123456789abcdef";
  d.worldSize = 8;
  d.devicesPerNode = 4;
  d.deviceMemory = int64_t{40} << 30;
  d.batchSize = 64;
  d.microBatchCount = 4;
  d.schedule = "gpipe";
  d.options = {{"mem_margin", "0.1"}};
  std::vector<std::vector<int>> ranks = {{0, 1, 2, 3}, {4, 5}, {6}};
  for (int s = 0; s < 3; ++s) {
    core::StageDeployment st;
    st.id = s;
    st.name = "STAGE_" + std::to_string(s * 10) + "_" + std::to_string(s * 10 + 9);
    st.nodes = {s * 2, s * 2 + 1};
    st.ranks = ranks[s];
    st.forwardSeconds = 1e-3 * (s + 1);
    st.backwardSeconds = 2e-3 * (s + 1);
    st.sendForwardSeconds = s < 2 ? 1e-4 : 0;
    st.sendBackwardSeconds = s > 0 ? 1e-4 : 0;
    st.allreduceSeconds = st.ranks.size() > 1 ? 3e-3 : 0;
    st.paramBytes = int64_t{1} << 30;
    st.gradientBytes = int64_t{1} << 30;
    st.optimizerBytes = int64_t{2} << 30;
    st.activationBytes = int64_t{3 + s} << 30;
    st.workingBytes = int64_t{100} << 20;
    st.commBufferBytes = int64_t{8} << 20;
    st.totalMemoryBytes = st.paramBytes + st.gradientBytes + st.optimizerBytes + st.activationBytes +
                          st.workingBytes + st.commBufferBytes;
    d.stages.push_back(st);
  }
  d.routes = {{0, core::kFeederStage, {0}, false, false}, {5, 0, {1}, false, true},
              {9, 1, {2}, false, true}, {12, 2, {}, true, true}};
  d.predictedIterationSeconds = 0.05;
  return d;
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Checks that every element is closed in order (XML-style well-formedness of the page, with the
// <!DOCTYPE> skipped); returns the first problem or "".
std::string wellFormedProblem(const std::string& html) {
  std::vector<std::string> open;
  for (size_t i = html.find('<'); i != std::string::npos; i = html.find('<', i + 1)) {
    const size_t end = html.find('>', i);
    if (end == std::string::npos) return "unterminated tag at " + std::to_string(i);
    const std::string tag = html.substr(i + 1, end - i - 1);
    if (tag.rfind("!DOCTYPE", 0) == 0) continue;
    if (tag.find('<') != std::string::npos) return "'<' inside tag at " + std::to_string(i);
    if (!tag.empty() && tag.back() == '/') continue;  // self-closing
    std::string name = tag.substr(tag[0] == '/' ? 1 : 0);
    name = name.substr(0, name.find_first_of(" \n\t"));
    if (tag[0] != '/') {
      open.push_back(name);
    } else if (open.empty() || open.back() != name) {
      return "</" + name + "> closes <" + (open.empty() ? "nothing" : open.back()) + ">";
    } else {
      open.pop_back();
    }
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

// Step 2 of ranks 0 and 1; `extra` adds events at the end of the list.
std::string twoRankJson(const std::string& extra = "") {
  return R"({"traceEvents":[
    {"name":"forward","ph":"X","ts":1000,"dur":500,"pid":0,"tid":0,"args":{"stage":0,"micro_batch":0,"step":1}},
    {"name":"forward","ph":"X","ts":2000000,"dur":500,"pid":0,"tid":0,"args":{"stage":0,"micro_batch":0,"step":2}},
    {"name":"backward","ph":"X","ts":2003000,"dur":900,"pid":0,"tid":0,"args":{"stage":0,"micro_batch":0,"step":2}},
    {"name":"forward","ph":"X","ts":2000600,"dur":700,"pid":1,"tid":0,"args":{"stage":1,"micro_batch":0,"step":2}},
    {"name":"recv","ph":"X","ts":2000500,"dur":100,"pid":1,"tid":0,"args":{"stage":1,"micro_batch":0,"step":2}},
    {"name":"backward","ph":"X","ts":2001300,"dur":1500,"pid":1,"tid":0,"args":{"stage":1,"micro_batch":0,"step":2}},
    {"name":"allreduce","ph":"X","ts":2004000,"dur":300,"pid":1,"tid":0,"args":{"step":2}},
    {"name":"meta","ph":"M","pid":1})" + extra + "\n]}";
}

std::vector<MeasuredEvent> twoRankTrace() { return parseChromeTrace(twoRankJson(), "test"); }

// The two ranks' peak_memory events: rank 0 within its prediction + 25%, rank 1 over usable.
MeasuredTrace twoRankTraceWithMemory() {
  const std::string gib = std::to_string(int64_t{1} << 30);
  auto peak = [&](int rank, long step, int measured, int predicted) {
    return R"(,{"name":"peak_memory","ph":"i","s":"p","ts":2005000,"pid":)" + std::to_string(rank) +
           R"(,"tid":0,"args":{"step":)" + std::to_string(step) + R"(,"stage":)" + std::to_string(rank) +
           R"(,"measured":)" + std::to_string(measured * (int64_t{1} << 30)) + R"(,"predicted":)" +
           std::to_string(predicted * (int64_t{1} << 30)) + R"(,"usable":)" +
           std::to_string(int64_t{36} << 30) + R"(,"parameters":)" + gib + R"(,"gradients":)" + gib +
           R"(,"optimizer":)" + std::to_string(int64_t{2} << 30) + R"(,"transient":)" +
           std::to_string((measured - 4) * (int64_t{1} << 30)) + "}}";
  };
  const TraceRecords records =
      parseTraceRecords(twoRankJson(peak(0, 1, 99, 8) + peak(0, 2, 10, 8) + peak(1, 2, 40, 8)), "test");
  return selectLastStep(records.events, records.memory);
}

// The "Memory per device" section of a report page.
std::string memorySection(const std::string& html) {
  const size_t begin = html.find("<h2>Memory per device</h2>"), end = html.find("<h2>One iteration</h2>");
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  return html.substr(begin, end - begin);
}

}  // namespace

TEST_CASE("report page is well-formed, self-contained and draws every rank, stage and operation", "[cli]") {
  ReportInput input;
  input.deployment = sample();
  input.source = "deployment file: <sample>";
  const std::string html = renderReportHtml(input);
  INFO(html.substr(0, 400));
  REQUIRE(wellFormedProblem(html) == "");
  REQUIRE(html.rfind("<!DOCTYPE html>", 0) == 0);
  for (const char* external : {"<script", "src=", "href=", "url(", "@import", "<link"})
    REQUIRE(count(html, external) == 0);
  REQUIRE(count(html, "<svg ") == 3);  // ranks, memory, predicted Gantt
  REQUIRE(count(html, "&lt;sample&gt;") == 1);  // escaped
  // Rank boxes: 4, 2 and 1 per stage, rank 7 idle, grouped in two nodes.
  REQUIRE(count(html, "class=\"rank\" data-rank=\"") == 8);
  REQUIRE(count(html, "class=\"rank\" data-rank=\"7\" data-stage=\"-1\"") == 1);
  for (int s = 0; s < 3; ++s) {
    const std::string stage = "data-stage=\"" + std::to_string(s) + "\"";
    REQUIRE(std::regex_search(html, std::regex("class=\"rank\" data-rank=\"[0-9]\" " + stage)));
    REQUIRE(count(html, "class=\"op forward\" " + stage) == 4);   // one per micro-batch
    REQUIRE(count(html, "class=\"op backward\" " + stage) == 4);
    for (const char* part : {"params", "grads", "optimizer", "activations", "working", "comm"})
      REQUIRE(count(html, std::string("class=\"mem ") + part + "\" " + stage) == 1);
  }
  REQUIRE(count(html, "class=\"rank\" data-rank=\"3\" data-stage=\"0\"") == 1);
  REQUIRE(count(html, "class=\"rank\" data-rank=\"6\" data-stage=\"2\"") == 1);
  REQUIRE(count(html, "class=\"op send_forward\"") == 8);   // stages 0 and 1
  REQUIRE(count(html, "class=\"op send_backward\"") == 8);  // stages 1 and 2
  REQUIRE(count(html, "class=\"op allreduce\"") == 2);      // the replicated stages
  REQUIRE(count(html, "class=\"limit\"") == 1);
  REQUIRE(count(html, "class=\"device\"") == 1);
  for (const char* label : {">node 0<", ">node 1<", ">rank 7<", ">idle<", "S1 STAGE_10_19<", ">usable 36.00 GiB<",
                            ">device 40.00 GiB<", ">S1 ranks 4-5<", ">gpipe<"}) {
    INFO(label);
    REQUIRE(count(html, label) >= 1);
  }
  REQUIRE(count(html, "class=\"measured") == 0);
}

TEST_CASE("report with a measured trace draws it on the predicted time scale", "[cli]") {
  ReportInput input;
  input.deployment = sample();
  input.trace = selectLastStep(twoRankTrace());
  const std::string html = renderReportHtml(input);
  REQUIRE(wellFormedProblem(html) == "");
  REQUIRE(count(html, "<svg ") == 4);
  REQUIRE(count(html, "class=\"measured forward\" data-rank=\"0\"") == 1);
  REQUIRE(count(html, "class=\"measured forward\" data-rank=\"1\"") == 1);
  REQUIRE(count(html, "class=\"measured backward\"") == 2);
  REQUIRE(count(html, "class=\"measured recv\"") == 1);
  REQUIRE(count(html, "class=\"measured allreduce\"") == 1);
  REQUIRE(count(html, ">rank 1 (S1)<") == 1);
  // The predicted iteration is longer than the measured step, so both share its scale: the
  // measured axis has the same ticks as the predicted one.
  const double iteration = simulateDeployment(input.deployment).iterationSeconds;
  REQUIRE(iteration > input.trace->spanSeconds());
  REQUIRE(count(html, "class=\"tick\">" + formatSeconds(niceTicks(iteration).back()) + "<") == 2);
}

TEST_CASE("report with measured memory: each rank's peak beside its stage's prediction", "[cli]") {
  ReportInput input;
  input.deployment = sample();
  input.trace = twoRankTraceWithMemory();
  REQUIRE(input.trace->memory.size() == 2);  // step 2's; step 1's record is not shown
  const std::string html = renderReportHtml(input);
  const std::string memory = memorySection(html);
  INFO(memory);
  REQUIRE(wellFormedProblem(html) == "");
  // Bars: rank 0 under stage 0, rank 1 under stage 1, split like StepMemory.
  for (const char* part : {"params", "grads", "optimizer", "transient"})
    for (int rank : {0, 1}) {
      const std::string r = std::to_string(rank);
      REQUIRE(count(memory, std::string("class=\"measured-mem ") + part + "\" data-rank=\"" + r +
                                "\" data-stage=\"" + r + "\"") == 1);
    }
  REQUIRE(memory.find(">rank 0 measured<") < memory.find("class=\"mem params\" data-stage=\"1\""));
  REQUIRE(memory.find(">rank 1 measured<") > memory.find("class=\"mem params\" data-stage=\"1\""));
  REQUIRE(count(memory, ">10.00 GiB (+25.0%)<") == 1);
  REQUIRE(count(memory, ">40.00 GiB (+400.0%) over usable<") == 1);
  // The table: rank, stage, predicted, measured, difference, parts, usable, flag.
  REQUIRE(count(html, "<table id=\"measured-memory\">") == 1);
  REQUIRE(count(memory, "<tr><td>0</td><td>S0</td><td>8.00 GiB</td><td>10.00 GiB</td><td>+25.0%</td>"
                        "<td>1.00 GiB</td><td>1.00 GiB</td><td>2.00 GiB</td><td>6.00 GiB</td>"
                        "<td>36.00 GiB</td><td class=\"left\">ok</td></tr>") == 1);
  REQUIRE(count(memory, "<tr><td>1</td><td>S1</td><td>8.00 GiB</td><td>40.00 GiB</td><td>+400.0%</td>") == 1);
  REQUIRE(count(memory, ">over usable</td>") == 1);
  REQUIRE(count(memory, "in step 2 of the runtime trace") == 1);
}

TEST_CASE("report without measured memory: the memory section is unchanged", "[cli]") {
  ReportInput plain;
  plain.deployment = sample();
  ReportInput traced = plain;
  traced.trace = selectLastStep(twoRankTrace());
  const std::string memory = memorySection(renderReportHtml(plain));
  REQUIRE(memorySection(renderReportHtml(traced)) == memory);
  REQUIRE(memory.find("measured") == std::string::npos);
  REQUIRE(memorySvg(plain.deployment) == memorySvg(plain.deployment, {}));
}

TEST_CASE("measured trace: the last step every rank recorded, relative times", "[cli]") {
  MeasuredTrace t = selectLastStep(twoRankTrace());
  REQUIRE(t.step == 2);
  REQUIRE(t.events.size() == 6);
  REQUIRE(t.ranks == std::vector<int>{0, 1});
  REQUIRE(t.events[0].startSeconds == Approx(0));
  REQUIRE(t.spanSeconds() == Approx(4.3e-3));
  REQUIRE_THROWS_AS(parseChromeTrace("{\"traceEvents\": [", "x"), FormatError);
  REQUIRE_THROWS_AS(parseChromeTrace("{\"other\": []}", "x"), FormatError);
  // Deep nesting is refused with a message, not a stack overflow.
  REQUIRE_THROWS_WITH(parseChromeTrace(std::string(100000, '['), "x"),
                      Catch::Contains("nested deeper than 64 levels"));
  REQUIRE_THROWS_AS(selectLastStep({}), FormatError);
}

TEST_CASE("show: stages, times, memory and routes of a deployment", "[cli]") {
  std::ostringstream out;
  printDeployment(out, sample());
  const std::string text = out.str();
  INFO(text);
  REQUIRE(count(text, "STAGE_0_9") == 3);  // stages, times, memory tables
  REQUIRE(count(text, " 0-3 ") == 1);
  REQUIRE(count(text, "world size 8, 4 devices per node") == 1);
  REQUIRE(count(text, "micro-batches 4, schedule gpipe") == 1);
  REQUIRE(count(text, "usable 36.00 GiB") == 1);
  REQUIRE(count(text, "feeder") == 1);
  REQUIRE(text.find("routes (4):") != std::string::npos);
  REQUIRE(formatRanks({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8");
}

TEST_CASE("simulated deployment: gpipe stage times add up as the flow-shop formula says", "[cli]") {
  core::Deployment d = sample();
  const decomposer::SimulationResult sim = simulateDeployment(d);
  // gpipe with M = 4: forward phase sum_s (F + sF) + 3 max(F + sF), backward likewise; the
  // slowest stage (2) dominates both phases.
  const double forward = (1.1e-3 + 2.1e-3 + 3e-3) + 3 * 3e-3;
  const double backward = (2e-3 + 4.1e-3 + 6.1e-3) + 3 * 6.1e-3;
  REQUIRE(sim.pipelineSeconds == Approx(forward + backward));
  REQUIRE(sim.iterationSeconds == Approx(forward + backward + 3e-3));
}

TEST_CASE("show and report refuse a file of another kind with the file format's FormatError", "[cli]") {
  const std::string path = testing::scratchPath("report_html_test", "graph.pb").string();
  core::writeFramedFile(path, "graph", 1, "not a deployment");
  std::ostringstream out;
  try {
    runShowCommand({path}, out);
    FAIL("no error");
  } catch (const FormatError& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find(path) != std::string::npos);
    REQUIRE(std::string(e.what()).find("deployment") != std::string::npos);
  }
  REQUIRE_THROWS_AS(runReportCommand({path, "-o", path + ".html"}, out), FormatError);
  REQUIRE_FALSE(std::filesystem::exists(path + ".html"));
  REQUIRE_THROWS_AS(runReportCommand({path}, out), ConfigError);  // no -o
  std::filesystem::remove(path);
}

TEST_CASE("autostage show and the report give each stage's ZeRO-1 setting", "[cli]") {
  core::Deployment d = sample();
  d.stages[0].zero = true;  // the 4-replica stage shards its optimizer state
  std::ostringstream shown;
  printDeployment(shown, d);
  const std::string text = shown.str();
  // name, nodes, ranks, replicas, tp, recompute, zero
  const std::regex row(R"(STAGE_\S+\s+\d+\s+\S+\s+\d+\s+1\s+(yes|no)\s+([01])\s)");
  std::vector<std::string> zero;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), row); it != std::sregex_iterator(); ++it)
    zero.push_back((*it)[2]);
  CHECK(zero == std::vector<std::string>{"1", "0", "0"});
  ReportInput input;
  input.deployment = d;
  const std::string html = renderReportHtml(input);
  CHECK(count(html, "<th>zero</th>") == 1);
  const std::regex cell(R"(<td>(yes|no)</td><td>([01])</td>)");
  std::vector<std::string> cells;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), cell); it != std::sregex_iterator(); ++it)
    cells.push_back((*it)[2]);
  CHECK(cells == std::vector<std::string>{"1", "0", "0"});
}

TEST_CASE("autostage show and the report give each stage's tensor-parallel degree", "[cli]") {
  core::Deployment d = sample();
  d.stages[0].tensorParallel = 2;  // ranks 0-3: 2 replicas of 2 ranks
  d.stages[1].tensorParallel = 2;  // ranks 4-5: 1 replica of 2 ranks
  std::ostringstream shown;
  printDeployment(shown, d);
  const std::string text = shown.str();
  // name, nodes, ranks, replicas, tp
  const std::regex row(R"((STAGE_\S+)\s+\d+\s+\S+\s+(\d+)\s+(\d+)\s+(yes|no)\s)");
  std::vector<std::string> shape;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), row); it != std::sregex_iterator(); ++it)
    shape.push_back((*it)[2].str() + "x" + (*it)[3].str());
  CHECK(shape == std::vector<std::string>{"2x2", "1x2", "1x1"});
  ReportInput input;
  input.deployment = d;
  const std::string html = renderReportHtml(input);
  CHECK(count(html, "<th>replicas</th><th>tp</th>") == 1);
  const std::regex cell(R"(<td>(\d+)</td><td>(\d+)</td><td>(yes|no)</td>)");
  shape.clear();
  for (auto it = std::sregex_iterator(html.begin(), html.end(), cell); it != std::sregex_iterator(); ++it)
    shape.push_back((*it)[1].str() + "x" + (*it)[2].str());
  CHECK(shape == std::vector<std::string>{"2x2", "1x2", "1x1"});
}

TEST_CASE("show and report of a saved deployment name its hosts and the stages on each", "[cli]") {
  core::Deployment d = sample();  // Note [Hosts of a deployment]: ranks 0-3 on alpha, 4-7 on beta
  d.rankHosts = {"alpha", "alpha", "alpha", "alpha", "beta", "beta", "beta", "beta"};
  const std::string path = testing::scratchPath("report_html_test", "hosts.pb").string();
  core::saveDeployment(d, path);
  std::ostringstream shown;
  REQUIRE(runShowCommand({path}, shown) == 0);
  const std::string text = shown.str();
  INFO(text);
  CHECK(count(text, "hosts: alpha (ranks 0,1,2,3), beta (ranks 4,5,6,7)\n") == 1);
  CHECK(count(text, "stages on hosts: STAGE_0_9 on alpha (ranks 0,1,2,3); STAGE_10_19 on beta "
                    "(ranks 4,5); STAGE_20_29 on beta (ranks 6)\n") == 1);
  std::ostringstream written;
  REQUIRE(runReportCommand({path, "-o", path + ".html"}, written) == 0);
  std::ifstream file(path + ".html");
  const std::string html((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  REQUIRE(wellFormedProblem(html) == "");
  CHECK(count(html, "<h2>Hosts</h2>") == 1);
  CHECK(count(html, "<tr><td class=\"left\">alpha</td><td>0-3</td><td class=\"left\">") == 1);
  CHECK(count(html, "<tr><td class=\"left\">beta</td><td>4-7</td><td class=\"left\">") == 1);
  const size_t betaRow = html.find(">beta</td><td>4-7<");
  REQUIRE(betaRow != std::string::npos);
  const std::string beta = html.substr(betaRow, html.find("</tr>", betaRow) - betaRow);
  CHECK(count(beta, "STAGE_10_19<") == 1);
  CHECK(count(beta, "STAGE_20_29<") == 1);
  CHECK(count(beta, "STAGE_0_9<") == 0);
  CHECK(count(html, "<th class=\"left\">hosts</th>") == 1);  // a column of the stage table
  CHECK(count(html, "<td>0-3</td><td class=\"left\">alpha</td>") == 1);
  CHECK(count(html, ">node 0: alpha<") == 1);  // the rank picture's nodes
  CHECK(count(html, ">node 1: beta<") == 1);
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".html");
}

TEST_CASE("show and report of a one-host deployment name no host", "[cli]") {
  std::ostringstream shown;
  printDeployment(shown, sample());
  CHECK(shown.str().find("hosts") == std::string::npos);
  ReportInput input;
  input.deployment = sample();
  const std::string html = renderReportHtml(input);
  CHECK(count(html, "<h2>Hosts</h2>") == 0);
  CHECK(count(html, "<table id=\"hosts\">") == 0);
  CHECK(count(html, ">hosts</th>") == 0);
  CHECK(count(html, ">node 0<") == 1);
}
