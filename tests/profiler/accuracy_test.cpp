// Acceptance: after calibration, the composed cost model predicts forward+backward time of
// random contiguous blocks (each >= 2 ms) and their peak memory, for an MLP, a transformer
// encoder and torchvision resnet18. Prints the errors it measured.
//
// Note [Accuracy tests in ctest]
// Memory is deterministic: ctest checks it within 20%. Time is not: the 20% target is what
// bench/profiler_accuracy/run measures (it sets PROFILER_ACCURACY_TIME_TOLERANCE=0.2 and prints
// the largest error per run). Since every figure, the test's reference included, is the smallest
// pass median over passes spread in time (Note [Measurement passes] in profiler/node_runner.h),
// the largest error was 9.2% over 11 runs on a quiet machine -- but a CI run on the shared 2 cores
// measured 22.3% for one resnet18 block, so ctest checks only what holds at ten times the load:
// prediction and measurement within a factor of 2 (a missing backward pass, a block counted twice
// or a calibration factor applied the wrong way round all fail it). Under sanitizers the time is
// printed, never checked: instrumentation slows the per-node runs and the blocks differently.
#include "catch_torch.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include "autostage/build_config.h"

#include "profiler/calibration.h"
#include "profiler/cost_model.h"
#include "profiler/profiler.h"
#include "test_models.h"

using namespace autostage;
using namespace autostage::profiler;

namespace {

constexpr double kMemoryTolerance = 0.20;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// The largest accepted time error (relative to the measurement), and whether time is checked at
// all (Note [Accuracy tests in ctest]).
struct TimeCheck {
  bool enabled = true;
  double tolerance = 0;  // 0: within a factor of 2 either way
};

TimeCheck timeCheck() {
  TimeCheck check;
  check.enabled = !kSanitized;
  if (const char* text = std::getenv("PROFILER_ACCURACY_TIME_TOLERANCE")) {
    check.tolerance = std::atof(text);
    if (check.tolerance <= 0 || check.tolerance >= 1) {
      FAIL("PROFILER_ACCURACY_TIME_TOLERANCE=" << text << " is not a fraction in (0, 1)");
    }
  }
  return check;
}

bool timeWithin(const TimeCheck& check, double predicted, double measured) {
  if (check.tolerance > 0) return std::abs(predicted - measured) <= check.tolerance * measured;
  return predicted <= 2 * measured && measured <= 2 * predicted;
}

std::vector<core::NodeId> range(core::NodeId begin, core::NodeId end) {
  std::vector<core::NodeId> ids;
  for (core::NodeId n = begin; n < end; ++n) ids.push_back(n);
  return ids;
}

// Per-node predictions of a block, to see where a bad prediction comes from.
void printBreakdown(const core::Graph& graph, const core::GraphProfile& profile,
                    core::NodeId begin, core::NodeId end, int64_t batch) {
  for (core::NodeId n = begin; n < end; ++n) {
    const core::NodeProfile& p = profile.nodes[n];
    std::printf("  %-60s fwd %.3f ms bwd %.3f ms\n", nodeLabel(graph, n).c_str(),
                1e3 * p.forwardSeconds.at(batch), 1e3 * p.backwardSeconds.at(batch));
  }
}

// Checks every block's time and memory errors (and prints them).
// `backend`: the CPU's unless given (the GPU case: the model and inputs are on its device).
void checkAccuracy(const std::string& name, const testing::TestModel& m,
                   std::unique_ptr<MeasurementBackend> backend = nullptr) {
  const TimeCheck check = timeCheck();
  // One thread: the machine is shared, and two threads fighting other jobs make every
  // measurement (reference and prediction alike) noisy.
  at::set_num_threads(1);
  torchscript::ImportedModel model = torchscript::importModule(m.module, m.inputs);
  // Process CPU time: other engineers' builds share these 2 cores; wall time would measure them.
  if (!backend) backend = createCpuMeasurementBackend(CpuClock::ProcessCpu);
  ProfilerOptions options;
  options.progressBar = false;
  // No load normalization: process CPU time already leaves other jobs out, and rescaling by a
  // 0.1 ms probe kernel added noise of its own (calibration factors 0.75-1.55 between runs).
  options.normalizeLoad = false;
  core::GraphProfile profile = profileGraph(model, m.inputs, *backend, options);
  int64_t batch = profile.batchSizes.back();
  std::printf("%s: %zu nodes, calibration factor %.3f, in-sample calibration error %.1f%%\n",
              name.c_str(), model.graph.nodeCount(), profile.calibration,
              100 * profile.calibrationError);
  // Fresh blocks (another seed than calibration's), measured independently.
  auto blocks = pickBlocks(model.graph, profile, batch, 3, 3e-3 / profile.calibration, 977);
  REQUIRE(blocks.size() == 3);
  // The reference: 3 timed runs of each block per pass over the three, after 2 warm-ups, in at
  // least 5 passes spanning at least 2 s; the smallest pass median (Note [Measurement passes]
  // in profiler/node_runner.h).
  std::vector<BlockMeasurement> measurements =
      measureBlocks(model, m.inputs, blocks, batch, *backend, {2, 3, false}, 5, 2.0);
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto [begin, end] = blocks[i];
    BlockPrediction predicted = predictBlock(model.graph, profile, range(begin, end), batch, 0);
    const BlockMeasurement& measured = measurements[i];
    double timeError = std::abs(predicted.seconds() - measured.seconds()) / measured.seconds();
    double memoryError = std::abs(static_cast<double>(predicted.peakBytes - measured.peakBytes)) /
                         static_cast<double>(measured.peakBytes);
    std::printf(
        "%s block [%d, %d): time predicted %.2f ms measured %.2f ms (error %.1f%%), peak "
        "predicted %.2f MiB measured %.2f MiB (error %.1f%%)\n",
        name.c_str(), begin, end, 1e3 * predicted.seconds(), 1e3 * measured.seconds(),
        100 * timeError, predicted.peakBytes / 1048576.0, measured.peakBytes / 1048576.0,
        100 * memoryError);
    bool timeOk = timeWithin(check, predicted.seconds(), measured.seconds());
    if (!timeOk || timeError > 0.2) printBreakdown(model.graph, profile, begin, end, batch);
    INFO(name << " block [" << begin << ", " << end << ")");
    CHECK(measured.seconds() >= 2e-3);
    if (check.enabled) {
      INFO("time predicted " << predicted.seconds() << " s, measured " << measured.seconds()
                             << " s (" << (check.tolerance > 0 ? "tolerance " : "factor 2")
                             << (check.tolerance > 0 ? std::to_string(check.tolerance) : "")
                             << ")");
      CHECK(timeOk);
    }
    CHECK(memoryError <= kMemoryTolerance);
  }
}

}  // namespace

// Registered with CTest's RUN_SERIAL (accuracy_serial.cmake): timings are taken in process
// CPU time on one thread, but parallel tests still disturb them through shared caches.
// Block starts are drawn with a fixed seed (977, unlike calibration's); each block grows until
// its predicted time reaches 3 ms. Run alone: build/tests/profiler/profiler_tests "[accuracy]".
TEST_CASE("accuracy: MLP blocks", "[profiler][accuracy]") {
  torch::manual_seed(11);
  checkAccuracy("mlp", testing::makeMlp(512, 8, 64));
}

TEST_CASE("accuracy: transformer encoder blocks", "[profiler][accuracy]") {
  checkAccuracy("transformer", testing::loadTracedModel("transformer"));
}

TEST_CASE("accuracy: resnet18 blocks", "[profiler][accuracy]") {
  checkAccuracy("resnet18", testing::loadTracedModel("resnet18"));
}

// The same on the GPU, with the CUDA measurement backend (events, the caching allocator's
// peak). Only in a CUDA build (scripts/test-gpu; it sets PROFILER_ACCURACY_TIME_TOLERANCE=0.2, the
// issue's target); without a visible GPU ctest reports it skipped.
#if AUTOSTAGE_WITH_NCCL
TEST_CASE("accuracy: transformer encoder blocks on the GPU", "[profiler][accuracy]") {
  if (!torch::cuda::is_available()) {
    std::printf("AUTOSTAGE_TEST_SKIPPED: no GPU visible, the GPU accuracy case did not run\n");
    return;
  }
  testing::TestModel m = testing::loadTracedModel("transformer");
  const c10::Device gpu(c10::DeviceType::CUDA, 0);
  m.module.to(gpu);
  for (c10::IValue& input : m.inputs) input = input.toTensor().to(gpu);
  checkAccuracy("transformer (cuda)", m, createMeasurementBackend(0));
}
#endif
