#include "profiler/profiler.h"

#include "catch_torch.h"

#include <torch/cuda.h>

#include "autostage/build_config.h"

#include "core/error.h"
#include "core/file_system.h"
#include "frontend/torchscript/autocast.h"
#include "profiler/cost_model.h"
#include "profiler/node_pass.h"
#include "profiler/node_runner.h"
#include "profiler/progress.h"
#include "test_models.h"

using namespace autostage;
using namespace autostage::profiler;

namespace {

ProfilerOptions quickOptions() {
  ProfilerOptions options;
  options.repeats = 3;
  options.passSeconds = 0;  // exactly `passes` timing passes
  options.calibrationBlocks = 0;
  options.progressBar = false;
  return options;
}

// A device whose first run allocates a buffer it keeps (cuBLAS's workspace on CUDA), simulated
// over the CPU backend: `kWorkspace` bytes count as allocated once any node ran after this
// backend was made. Note [Settling runs] (profiler/node_runner.cpp).
class LazyWorkspaceBackend final : public MeasurementBackend {
 public:
  static constexpr int64_t kWorkspace = 16 << 20;
  explicit LazyWorkspaceBackend(int settlingRuns)
      : cpu_(createCpuMeasurementBackend()), settling_(settlingRuns), start_(executionCount()) {}
  std::string deviceKind() const override { return "lazy-workspace"; }
  std::string device() const override { return "cpu"; }
  double time(const std::function<void()>& work) override { return cpu_->time(work); }
  int64_t currentMemory() const override { return cpu_->currentMemory() + workspace(); }
  int64_t peakMemory() const override { return cpu_->peakMemory() + workspace(); }
  void resetPeakMemory() override { cpu_->resetPeakMemory(); }
  int settlingRuns() const override { return settling_; }

 private:
  int64_t workspace() const { return executionCount() > start_ ? kWorkspace : 0; }
  std::unique_ptr<MeasurementBackend> cpu_;
  int settling_;
  int64_t start_;
};

std::string freshDir(const std::string& name) {
  // Note [No std::filesystem next to LibTorch wheels] (core/file_system.h)
  std::string dir = core::joinPath(core::tempDirectory(), "autostage_profiler_test_" + name);
  core::removeAll(dir);
  return dir;
}

std::vector<core::NodeId> groupsOfKind(const core::Graph& g, const std::string& kind) {
  std::vector<core::NodeId> ids;
  for (const NodeGroup& group : nodeGroups(g))
    if (g.node(group.key).kind == kind) ids.push_back(group.key);
  return ids;
}

}  // namespace

TEST_CASE("the job's device chooses the measurement backend - cuda needs a CUDA build",
          "[profiler]") {
  auto cpu = createMeasurementBackend(-1);
  CHECK(cpu->deviceKind() == "cpu");
  CHECK(cpu->device() == "cpu");
#if AUTOSTAGE_WITH_NCCL
  if (torch::cuda::device_count() > 0) {
    auto cuda = createMeasurementBackend(0);
    CHECK(cuda->device() == "cuda:0");
    CHECK(cuda->deviceKind().rfind("cuda:", 0) == 0);
    CHECK(cuda->deviceKind().size() > 5);  // names the GPU model (the profile cache key)
  }
#else
  CHECK_THROWS_AS(createMeasurementBackend(1), UnsupportedError);
  CHECK_THROWS_WITH(createMeasurementBackend(1),
                    Catch::Contains("profiling on cuda:1") &&
                        Catch::Contains("-DAUTOSTAGE_WITH_CUDA=ON"));
#endif
}

TEST_CASE("MLP node profiles: exact bytes, positive times, all groups measured", "[profiler]") {
  torch::manual_seed(3);
  const int64_t width = 64, batch = 16;
  testing::TestModel m = testing::makeMlp(width, 3, batch);
  torchscript::ImportedModel model = torchscript::importModule(m.module, m.inputs);
  auto backend = createCpuMeasurementBackend();
  core::GraphProfile profile = profileNodes(model, m.inputs, *backend, quickOptions());
  REQUIRE(profile.nodes.size() == model.graph.nodeCount());
  CHECK(profile.batchSizes == std::vector<int64_t>{4, 8});
  CHECK(profile.deviceKind == "cpu");
  CHECK(profile.dtype == "Float");
  CHECK(profile.graphHash == model.graph.hash());

  std::vector<core::NodeId> linear = groupsOfKind(model.graph, "aten::addmm");
  std::vector<core::NodeId> relu = groupsOfKind(model.graph, "aten::relu");
  REQUIRE(linear.size() == 3);
  REQUIRE(relu.size() == 3);
  const double row = width * 4.0;  // bytes of one sample's activation
  int64_t params = 0;
  for (const auto& p : profile.nodes) params += p.paramBytes;
  CHECK(params == 3 * (width * width + width) * 4);
  for (core::NodeId n : linear) {
    const core::NodeProfile& p = profile.nodes[n];
    INFO(nodeLabel(model.graph, n));
    CHECK(p.failure.empty());
    CHECK(p.paramBytes == (width * width + width) * 4);
    CHECK(p.forwardSeconds.at(batch) > 0);
    CHECK(p.backwardSeconds.at(batch) > 0);
    CHECK(p.outputBytes.at(batch) == Approx(batch * row));
    CHECK(p.outputBytes.at(4) == Approx(4 * row));
    // addmm keeps its input (mat1) for the weight gradient; the weight is a parameter.
    CHECK(p.activationBytes.at(batch) == Approx(batch * row));
  }
  for (core::NodeId n : relu) {
    INFO(nodeLabel(model.graph, n));
    CHECK(profile.nodes[n].outputBytes.at(batch) == Approx(batch * row));
    CHECK(profile.nodes[n].activationBytes.at(batch) == Approx(0));  // relu keeps its output
    CHECK(profile.nodes[n].paramBytes == 0);
  }
}

TEST_CASE("later timing passes re-time the measured groups, unless their inputs exceed the budget",
          "[profiler]") {
  torch::manual_seed(4);
  testing::TestModel m = testing::makeMlp(32, 3, 8);
  torchscript::ImportedModel model = torchscript::importModule(m.module, m.inputs);
  auto backend = createCpuMeasurementBackend();
  ProfilerOptions options = quickOptions();  // 3 passes of 3 timed runs
  int64_t before = executionCount();
  core::GraphProfile spread = profileNodes(model, m.inputs, *backend, options);
  int64_t inPasses = executionCount() - before;
  options.keptArgsBytes = 0;  // nothing may be kept: one pass per batch size
  before = executionCount();
  core::GraphProfile single = profileNodes(model, m.inputs, *backend, options);
  int64_t inOnePass = executionCount() - before;
  // Measured groups: all but the 3 that reuse an identical group's figures (see below); each
  // runs repeats more times in each later pass, and nothing else runs again.
  const int64_t measured = static_cast<int64_t>(nodeGroups(model.graph).size()) - 3;
  const int batchSizes = 2;
  CHECK(inPasses - inOnePass == measured * batchSizes * (options.passes - 1) * options.repeats);
  for (const core::GraphProfile* p : {&spread, &single})
    for (const NodeGroup& g : nodeGroups(model.graph)) {
      CHECK(p->nodes[g.key].forwardSeconds.at(4) > 0);
      CHECK(p->nodes[g.key].failure.empty());
    }
}

TEST_CASE("a buffer a device keeps from its first run is not charged to the first node",
          "[profiler]") {
  torch::manual_seed(4);
  testing::TestModel m = testing::makeMlp(32, 3, 8);
  torchscript::ImportedModel model = torchscript::importModule(m.module, m.inputs);
  auto cpu = createCpuMeasurementBackend();
  core::GraphProfile plain = profileNodes(model, m.inputs, *cpu, quickOptions());
  // Without settling runs the first node measured carries the whole workspace ...
  LazyWorkspaceBackend unsettled(0);
  core::GraphProfile charged = profileNodes(model, m.inputs, unsettled, quickOptions());
  // (over the batch sizes measured: the linear fit over them spreads it)
  int64_t extra = 0;
  for (int64_t b : plain.batchSizes)
    for (size_t n = 0; n < plain.nodes.size(); ++n)
      extra += static_cast<int64_t>(
          charged.nodes[n].workingBytes.at(b) + charged.nodes[n].activationBytes.at(b) -
          plain.nodes[n].workingBytes.at(b) - plain.nodes[n].activationBytes.at(b));
  CHECK(extra >= LazyWorkspaceBackend::kWorkspace);
  const int64_t batch = plain.batchSizes.back();
  // ... with one, every node's memory figures are the CPU's, and each node ran once more.
  LazyWorkspaceBackend settled(1);
  int64_t before = executionCount();
  core::GraphProfile fair = profileNodes(model, m.inputs, settled, quickOptions());
  int64_t settledRuns = executionCount() - before;
  before = executionCount();
  profileNodes(model, m.inputs, *cpu, quickOptions());
  int64_t cpuRuns = executionCount() - before;
  const int64_t measured = static_cast<int64_t>(nodeGroups(model.graph).size()) - 3;  // 3 reused
  CHECK(settledRuns - cpuRuns == measured * 2 /* batch sizes */);
  for (size_t n = 0; n < plain.nodes.size(); ++n) {
    INFO("node " << n);
    CHECK(fair.nodes[n].workingBytes.at(batch) == plain.nodes[n].workingBytes.at(batch));
    CHECK(fair.nodes[n].activationBytes.at(batch) == plain.nodes[n].activationBytes.at(batch));
    CHECK(fair.nodes[n].outputBytes.at(batch) == plain.nodes[n].outputBytes.at(batch));
  }
}

TEST_CASE("identical node groups are measured once and their figures reused", "[profiler]") {
  torch::manual_seed(4);
  testing::TestModel m = testing::makeMlp(32, 3, 8);
  torchscript::ImportedModel model = torchscript::importModule(m.module, m.inputs);
  auto backend = createCpuMeasurementBackend();
  ProfilerOptions options = quickOptions();
  options.reuseIdenticalGroups = false;
  int64_t before = executionCount();
  profileNodes(model, m.inputs, *backend, options);
  int64_t withoutReuse = executionCount() - before;
  options.reuseIdenticalGroups = true;
  before = executionCount();
  core::GraphProfile profile = profileNodes(model, m.inputs, *backend, options);
  int64_t withReuse = executionCount() - before;
  // fc1 reads the graph input, so it differs from fc2/fc3; relu1..3 are alike. Reused groups
  // (fc3 from fc2, relu2 and relu3 from relu1) run once per batch size (later timing passes
  // skip them) instead of the memory run + (warm-up - 1) + the timed runs of every pass.
  const int reusedGroups = 3, batchSizes = 2;
  REQUIRE(options.passes == 3);
  CHECK(withoutReuse - withReuse ==
        reusedGroups * batchSizes * (options.warmupRuns + options.repeats * options.passes - 1));
  CHECK(profile.batchSizes == std::vector<int64_t>{2, 4});
  std::vector<core::NodeId> linear = groupsOfKind(model.graph, "aten::addmm");
  std::vector<core::NodeId> relu = groupsOfKind(model.graph, "aten::relu");
  REQUIRE(linear.size() == 3);
  REQUIRE(relu.size() == 3);
  const core::NodeProfile &fc2 = profile.nodes[linear[1]], &fc3 = profile.nodes[linear[2]];
  CHECK(fc3.forwardSeconds == fc2.forwardSeconds);
  CHECK(fc3.backwardSeconds == fc2.backwardSeconds);
  CHECK(fc3.activationBytes == fc2.activationBytes);
  for (int i : {1, 2})
    CHECK(profile.nodes[relu[i]].forwardSeconds == profile.nodes[relu[0]].forwardSeconds);
  CHECK(profile.nodes[linear[2]].paramBytes == profile.nodes[linear[1]].paramBytes);
  CHECK_FALSE(profile.nodes[linear[0]].forwardSeconds == profile.nodes[linear[1]].forwardSeconds);
}

TEST_CASE("a cached profile is loaded without executing any node", "[profiler]") {
  torch::manual_seed(4);
  testing::TestModel m = testing::makeMlp(32, 2, 8);
  torchscript::ImportedModel model = torchscript::importModule(m.module, m.inputs);
  auto backend = createCpuMeasurementBackend();
  ProfilerOptions options = quickOptions();
  options.calibrationBlocks = 1;
  options.cacheDir = freshDir("cache");

  int64_t before = executionCount();
  core::GraphProfile first = profileGraph(model, m.inputs, *backend, options);
  int64_t afterFirst = executionCount();
  CHECK(afterFirst > before + static_cast<int64_t>(nodeGroups(model.graph).size()));
  std::string path = profileCachePath(options, profileKey(model, m.inputs, options, "cpu"));
  REQUIRE(core::pathExists(path));

  core::GraphProfile second = profileGraph(model, m.inputs, *backend, options);
  CHECK(executionCount() == afterFirst);  // nothing ran
  CHECK(second == first);
  CHECK(second.calibration == first.calibration);

  // Pointing another graph at this cache file is refused, naming the field.
  testing::TestModel other = testing::makeMlp(32, 3, 8);
  torchscript::ImportedModel otherModel = torchscript::importModule(other.module, other.inputs);
  ProfilerOptions wrong = options;
  wrong.cacheFile = path;
  CHECK_THROWS_AS(profileGraph(otherModel, other.inputs, *backend, wrong), FormatError);
  CHECK_THROWS_WITH(profileGraph(otherModel, other.inputs, *backend, wrong),
                    Catch::Contains("graph_hash") && Catch::Contains(otherModel.graph.hash()));
  CHECK(executionCount() == afterFirst);
}

TEST_CASE("a node that fails is reported with its input shapes and the run goes on",
          "[profiler]") {
  torch::manual_seed(5);
  testing::TestModel m = testing::makeBatchEightOnlyModel();
  torchscript::ImportedModel model = torchscript::importModule(m.module, m.inputs);
  auto backend = createCpuMeasurementBackend();
  ProfilerOptions options = quickOptions();
  options.batchSizes = {8, 16};  // 16: the example batch repeated twice
  core::GraphProfile profile = profileNodes(model, m.inputs, *backend, options);

  std::vector<core::NodeId> reshape = groupsOfKind(model.graph, "aten::reshape");
  std::vector<core::NodeId> linear = groupsOfKind(model.graph, "aten::addmm");
  REQUIRE(reshape.size() == 1);
  REQUIRE(linear.size() == 2);
  const core::NodeProfile& bad = profile.nodes[reshape[0]];
  CHECK_THAT(bad.failure, Catch::Contains("aten::reshape") && Catch::Contains("batch size 16") &&
                              Catch::Contains("Float[16, 16]"));
  CHECK(bad.maxBatch == 8);
  CHECK(bad.forwardSeconds.at(8) > 0);  // measured where it worked
  // fc1 before it works at both sizes; fc2 after it gets no input at 16.
  CHECK(profile.nodes[linear[0]].failure.empty());
  CHECK(profile.nodes[linear[1]].maxBatch == 8);
  std::vector<core::NodeId> all;
  for (core::NodeId n = 0; n < static_cast<core::NodeId>(model.graph.nodeCount()); ++n)
    all.push_back(n);
  CHECK(predictBlock(model.graph, profile, all, 8, 0).feasible);
  CHECK_FALSE(predictBlock(model.graph, profile, all, 16, 0).feasible);
}

TEST_CASE("a group reusing figures that fails at a batch keeps its figures of the others",
          "[profiler]") {
  torch::manual_seed(5);
  testing::TestModel m = testing::makeFailureBeforeIdenticalModel();
  torchscript::ImportedModel model = torchscript::importModule(m.module, m.inputs);
  const core::Graph& graph = model.graph;
  std::vector<NodeGroup> groups = nodeGroups(graph);
  std::vector<Unit> units = buildUnits(graph, groups);
  markIdenticalGroups(graph, units);
  exportUnits(graph, units);
  auto groupOf = [&](const std::string& scope) {
    for (const Unit& u : units)
      if (u.group >= 0 && graph.node(u.last).scope == scope) return u.group;
    FAIL("no node group of " << scope);
    return -1;
  };
  const int fc2 = groupOf("fc2"), fc3 = groupOf("fc3");
  auto backend = createCpuMeasurementBackend();
  std::vector<GroupSamples> samples(groups.size());
  ProgressReporter progress(static_cast<int64_t>(2 * groups.size()), "nodes", false);
  ForwardPass pass(model, units, *backend, {1, 3, false, nullptr}, 1e12);
  for (int64_t batch : {8, 16}) {  // the reshape before fc3 fails at 16
    pass.run(m.inputs, batch, samples, progress);
    REQUIRE(pass.canRetime());
    pass.retime(samples);
    pass.retime(samples);
  }
  REQUIRE(samples[fc2].batches == std::vector<int64_t>{8, 16});
  REQUIRE(samples[fc3].batches == std::vector<int64_t>{8});  // reused at 8, failed at 16
  // fc3's figures at 8 are fc2's at 8 after all three passes there, not fc2's at 16.
  CHECK(samples[fc2].runs[0].passMedians.forward.size() == 3);
  CHECK(samples[fc3].runs[0].passMedians.forward == samples[fc2].runs[0].passMedians.forward);
  CHECK(samples[fc3].runs[0].forwardSeconds == samples[fc2].runs[0].forwardSeconds);
  CHECK(samples[fc3].runs[0].backwardSeconds == samples[fc2].runs[0].backwardSeconds);
  CHECK_FALSE(samples[fc3].failure.empty());
}

TEST_CASE("profiler options validate and come from the config table", "[profiler]") {
  ProfilerOptions options;
  CHECK_NOTHROW(options.validate());
  options.repeats = 2;
  CHECK_THROWS_WITH(options.validate(), Catch::Contains("at least 3"));
  options = ProfilerOptions();
  options.batchSizes = {4, 4};
  CHECK_THROWS_AS(options.validate(), ConfigError);
  CHECK(parseBatchSizes("4, 8,16", "test") == std::vector<int64_t>{4, 8, 16});
  CHECK(parseBatchSizes("", "test").empty());
  CHECK_THROWS_WITH(parseBatchSizes("4,x", "test"), Catch::Contains("'x'"));
  CHECK(resolveBatchSizes(ProfilerOptions(), 16) == std::vector<int64_t>{4, 8});
  CHECK(resolveBatchSizes(ProfilerOptions(), 6) == std::vector<int64_t>{1, 3});
  CHECK(resolveBatchSizes(ProfilerOptions(), 2) == std::vector<int64_t>{1, 2});
  CHECK(resolveBatchSizes(ProfilerOptions(), 1) == std::vector<int64_t>{1});
  ProfilerOptions explicitSizes;
  explicitSizes.batchSizes = {8, 2};
  CHECK(resolveBatchSizes(explicitSizes, 6) == std::vector<int64_t>{2, 8});
  ProfilerOptions fromConfig = ProfilerOptions::fromConfig();
  CHECK(fromConfig.repeats == 3);
  CHECK(fromConfig.passes == 3);
  CHECK(fromConfig.calibrationBlocks == 4);
  CHECK_THAT(fromConfig.toString(), Catch::Contains("repeats=3 passes=3"));
  ProfilerOptions spread;
  spread.passes = 0;
  CHECK_THROWS_WITH(spread.validate(), Catch::Contains("profile_passes must be in 1..16"));
  spread.passes = 2;
  spread.passSeconds = -1;
  CHECK_THROWS_WITH(spread.validate(), Catch::Contains("profile_pass_seconds must be >= 0"));
  ProfilerOptions degrees;  // Note [Tensor-parallel profile]: 2, 4, 8, ascending
  degrees.splitDegrees = {2, 4, 8};
  CHECK_NOTHROW(degrees.validate());
  degrees.splitDegrees = {3};
  CHECK_THROWS_WITH(degrees.validate(), Catch::Contains("splitDegrees holds 3"));
  degrees.splitDegrees = {4, 2};
  CHECK_THROWS_WITH(degrees.validate(), Catch::Contains("4 is followed by 2"));
  degrees.splitDegrees = {2, 2};
  CHECK_THROWS_AS(degrees.validate(), ConfigError);
}

TEST_CASE("bf16 profiling measures the nodes under autocast", "[profiler]") {
  torch::manual_seed(3);
  const int64_t width = 64, batch = 16;
  testing::TestModel m = testing::makeMlp(width, 3, batch);
  torchscript::ImportedModel model = [&] {  // as driver::Module imports it
    torchscript::AutocastGuard autocast(core::Precision::Bf16, c10::kCPU);
    return torchscript::importModule(m.module, m.inputs);
  }();
  auto backend = createCpuMeasurementBackend();
  ProfilerOptions options = quickOptions();
  options.precision = core::Precision::Bf16;
  core::GraphProfile profile = profileNodes(model, m.inputs, *backend, options);
  CHECK(profile.dtype == "Float-autocast-bf16");  // a cache key apart from fp32 profiles
  CHECK_FALSE(torchscript::isAutocastEnabled(c10::kCPU));  // the guard ended with profiling
  const double row = width * 2.0;  // one sample's bf16 activation
  int64_t params = 0;
  for (const auto& p : profile.nodes) params += p.paramBytes;
  CHECK(params == 3 * (width * width + width) * 4);  // master weights stay fp32
  for (core::NodeId n : groupsOfKind(model.graph, "aten::addmm")) {
    INFO(nodeLabel(model.graph, n));
    const core::NodeProfile& p = profile.nodes[n];
    CHECK(p.failure.empty());
    CHECK(p.outputBytes.at(batch) == Approx(batch * row));
    // addmm keeps its bf16 input for the weight's gradient, and the bf16 copy of the weight for
    // its input's gradient where the input carries one (not in the first layer: the model's
    // input carries none, and the profiler now runs it that way too).
    bool inputGrad = false;
    for (core::ValueId v : model.graph.node(n).inputs) {
      const core::Value& value = model.graph.value(v);
      inputGrad = inputGrad || (value.type.isTensor() && value.cls == core::ValueClass::Batch &&
                                value.type.requiresGrad());
    }
    CHECK(p.activationBytes.at(batch) ==
          Approx(batch * row + (inputGrad ? width * width * 2.0 : 0.0)));
  }
  for (core::NodeId n : groupsOfKind(model.graph, "aten::relu"))
    CHECK(profile.nodes[n].outputBytes.at(batch) == Approx(batch * row));
}
