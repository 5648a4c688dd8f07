// Profiles a 24-layer BERT-shaped encoder (hidden 256) and resnet50 on this machine's CPU and
// prints, per model, the node count, the profiling time and the calibration error.
//
// usage: profile_models [--json] [--threads N] [model...]   (models: bert24 resnet50)
// Models are traced by tests/profiler/make_models.py (run once with the build's Python, into the build's test_models/ folder, shared with
// the profiler tests).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/script.h>

#include "frontend/torchscript/importer.h"
#include "profiler/cost_model.h"
#include "profiler/measurement_backend.h"
#include "profiler/profiler.h"

namespace {

using namespace autostage;

struct Loaded {
  torch::jit::Module module;
  std::vector<c10::IValue> inputs;
};

Loaded load(const std::string& name) {
  std::string dir = AUTOSTAGE_TEST_MODEL_DIR;
  std::string model = dir + "/" + name + ".pt", input = dir + "/" + name + ".input.pt";
  if (!std::filesystem::exists(model) || !std::filesystem::exists(input)) {
    std::string command = std::string(AUTOSTAGE_PYTHON_EXECUTABLE) + " " + AUTOSTAGE_SOURCE_DIR +
                          "/tests/profiler/make_models.py " + dir + " " + name;
    if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
  }
  torch::jit::Module inputs = torch::jit::load(input);
  return {torch::jit::load(model), {inputs.attr("x").toTensor()}};
}

void run(const std::string& name, bool json) {
  Loaded loaded = load(name);
  torchscript::ImportedModel model = torchscript::importModule(loaded.module, loaded.inputs);
  // Process CPU time: the 2 cores are shared with other jobs. No load normalization: with
  // process CPU time its probe kernel only added noise (see tests/profiler/accuracy_test.cpp).
  auto backend = profiler::createCpuMeasurementBackend(profiler::CpuClock::ProcessCpu);
  profiler::ProfilerOptions options;
  options.repeats = 3;
  options.normalizeLoad = false;
  auto start = std::chrono::steady_clock::now();
  core::GraphProfile profile = profiler::profileGraph(model, loaded.inputs, *backend, options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  size_t groups = profiler::nodeGroups(model.graph).size();
  if (json) {
    std::printf(
        "{\"model\": \"%s\", \"nodes\": %zu, \"node_groups\": %zu, \"profile_seconds\": %.2f, "
        "\"calibration_error\": %.4f, \"calibration_factor\": %.4f, \"threads\": %d}\n",
        name.c_str(), model.graph.nodeCount(), groups, seconds, profile.calibrationError,
        profile.calibration, at::get_num_threads());
  } else {
    std::printf("%-10s nodes %5zu  groups %5zu  profile %6.1f s  calibration factor %.3f  error "
                "%.1f%%\n", name.c_str(), model.graph.nodeCount(), groups, seconds,
                profile.calibration, 100 * profile.calibrationError);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::vector<std::string> models;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--json") json = true;
    else if (arg == "--threads" && i + 1 < argc) at::set_num_threads(std::atoi(argv[++i]));
    else models.push_back(arg);
  }
  if (models.empty()) models = {"bert24", "resnet50"};
  try {
    for (const auto& name : models) run(name, json);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profile_models: %s\n", e.what());
    return 1;
  }
  return 0;
}
