#include "profiler/node_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_set>

#include <ATen/ops/arange.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randn.h>
#include <torch/csrc/autograd/autograd.h>

#include "core/error.h"
#include "frontend/torchscript/autocast.h"
#include "profiler/profiler_options.h"

namespace autostage::profiler {
namespace {

std::atomic<int64_t> gExecutions{0};

void collectTensors(const c10::IValue& value, std::vector<at::Tensor>* out) {
  if (value.isTensor()) {
    out->push_back(value.toTensor());
  } else if (value.isTuple()) {
    for (const auto& e : value.toTupleRef().elements()) collectTensors(e, out);
  } else if (value.isList()) {
    for (const c10::IValue& e : value.toListRef()) collectTensors(e, out);
  }
}

int64_t distinctStorageBytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  int64_t total = 0;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const void* key = t.storage().unsafeGetStorageImpl();
    if (seen.insert(key).second) total += static_cast<int64_t>(t.storage().nbytes());
  }
  return total;
}

at::Tensor resizeTensor(const at::Tensor& t, int64_t fromBatch, int64_t batch) {
  if (t.dim() == 0 || t.size(0) != fromBatch || batch == fromBatch) return t;
  if (batch < fromBatch) return t.narrow(0, 0, batch).clone();
  at::Tensor index = at::arange(batch, at::kLong).remainder(fromBatch);
  return t.index_select(0, index);
}

// Everything one timed run needs: its arguments, the parameters whose grads it creates.
struct PreparedArgs {
  std::vector<c10::IValue> args;
  std::vector<at::Tensor> params;
  // Leaves requiring grad behind the non-BATCH inputs: held by the autograd graph until
  // backward whether or not an op saves them, so kept/peak figures leave them out.
  std::vector<at::Tensor> leaves;
  int64_t leafBytes = 0;
};

// A detached copy of an activation; floating ones (when `needsGrad`) become non-leaf copies of
// grad-requiring leaves: in-place ops (relu_) are illegal on such leaves themselves.
c10::IValue prepareValue(const c10::IValue& value, bool needsGrad, PreparedArgs* prepared) {
  if (value.isTensor()) {
    at::Tensor t = value.toTensor().detach().clone();
    if (!needsGrad || !t.is_floating_point()) return t;
    prepared->leafBytes += static_cast<int64_t>(t.storage().nbytes());
    t.requires_grad_(true);
    prepared->leaves.push_back(t);
    return t.clone();
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorVector())
      list.push_back(prepareValue(t, needsGrad, prepared).toTensor());
    return list;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const auto& e : value.toTupleRef().elements())
      elements.push_back(prepareValue(e, needsGrad, prepared));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return value;
}

PreparedArgs prepare(const core::Graph& graph, const torchscript::ExportedFunction& function,
                     const std::vector<c10::IValue>& args) {
  PreparedArgs prepared;
  for (size_t i = 0; i < args.size(); ++i) {
    const core::Value& value = graph.value(function.inputs()[i]);
    bool graphInput = value.producer == core::kNoNode;
    if (args[i].isTensor() && graphInput && value.cls == core::ValueClass::Param) {
      at::Tensor p = args[i].toTensor();
      if (p.requires_grad()) {
        p.mutable_grad() = at::Tensor();
        prepared.params.push_back(p);
      }
      prepared.args.push_back(p);
    } else {
      // Gradients flow into an activation only where the captured run had them (a
      // histogram of expert counts in an MoE router has none, and cumsum on it to an integer
      // dtype would fail under autograd).
      bool carriesGrad = !value.type.isTensor() || value.type.requiresGrad();
      prepared.args.push_back(prepareValue(args[i], !graphInput && carriesGrad, &prepared));
    }
  }
  return prepared;
}

std::vector<at::Tensor> differentiable(const std::vector<c10::IValue>& outputs) {
  std::vector<at::Tensor> tensors, result;
  for (const auto& o : outputs) collectTensors(o, &tensors);
  for (const auto& t : tensors)
    if (t.defined() && t.requires_grad()) result.push_back(t);
  return result;
}

void backward(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& grads) {
  if (!outputs.empty()) torch::autograd::backward(outputs, grads);
}

std::vector<at::Tensor> onesLike(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> ones;
  for (const auto& t : tensors) ones.push_back(at::ones_like(t));
  return ones;
}

void resetGrads(const std::vector<at::Tensor>& params) {
  for (at::Tensor p : params) p.mutable_grad() = at::Tensor();
}

// One untimed run that records memory figures (deterministic on the CPU allocator).
c10::IValue detached(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor().detach();
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorVector()) list.push_back(t.detach());
    return list;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const auto& e : value.toTupleRef().elements()) elements.push_back(detached(e));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return value;
}

// Note [Load normalization]
// Other jobs sharing the device slow every kernel by a factor that drifts over seconds. A fixed
// matmul on the backend's own device (a GPU job probes its GPU, not the host: 128x128 on the CPU,
// about a millisecond there; 2048x2048 on CUDA, a fraction of a millisecond on current GPUs),
// re-timed at most every kRefreshSeconds, estimates the current slowdown against the fastest it
// ever ran in this process; measured times are scaled by that ratio, so node and block
// measurements taken at different moments stay comparable. Each device keeps its own history.
constexpr double kRefreshSeconds = 0.25;

struct LoadProbe {
  at::Tensor a, b;
  double lastRefresh = -1e30, current = 1, best = 1e30;
};

double loadScale(MeasurementBackend& backend) {
  static std::mutex mutex;
  // Never destroyed: CUDA tensors must not be freed after the CUDA runtime shut down at exit.
  static auto* probes = new std::map<std::string, LoadProbe>();
  std::lock_guard<std::mutex> lock(mutex);
  const std::string device = backend.device();
  LoadProbe& probe = (*probes)[device];
  if (!probe.a.defined()) {
    const c10::Device where(device);
    const int64_t n = where.is_cpu() ? 128 : 2048;
    at::NoGradGuard noGrad;
    probe.a = at::randn({n, n}, at::TensorOptions().device(where));
    probe.b = at::randn({n, n}, at::TensorOptions().device(where));
  }
  if (wallSeconds() - probe.lastRefresh > kRefreshSeconds) {
    std::vector<double> times;
    for (int i = 0; i < 3; ++i)
      times.push_back(backend.time([&] { (void)at::mm(probe.a, probe.b); }));
    probe.current = median(times);
    probe.best = std::min(probe.best, probe.current);
    probe.lastRefresh = wallSeconds();
  }
  return std::min(1.0, probe.best / probe.current);
}

// Note [Settling runs]
// A library may allocate, on its first use in a thread, a buffer it keeps for the rest of the
// process: cuBLAS (by all signs; not identified on the GPU) takes its workspace from the CUDA
// caching allocator the first time a matmul runs on a stream, forward and again in autograd's
// backward thread. The memory run would charge it to whichever node ran a matmul first (on an H200,
// 2026-11-28, a stage of 10 KiB of parameters measured 16.8 MB, and no plan fit a test's memory
// limit). So a backend whose device does that asks for settlingRuns() untimed forward+backward runs
// of each node first; the memory run then sees only what the node itself allocates. The CPU
// allocator keeps nothing: none there, so CPU figures and run counts are unchanged.
void settle(const core::Graph& graph, const torchscript::ExportedFunction& function,
            const std::vector<c10::IValue>& args, int runs) {
  for (int i = 0; i < runs; ++i) {
    PreparedArgs prepared = prepare(graph, function, args);
    std::vector<c10::IValue> outputs = executeFunction(function, std::move(prepared.args));
    std::vector<at::Tensor> diff = differentiable(outputs);
    backward(diff, onesLike(diff));
    resetGrads(prepared.params);
  }
}

// One run that records memory figures (deterministic on the CPU allocator) and serves as the
// first warm-up; returns the outputs, detached.
std::vector<c10::IValue> measureMemory(const core::Graph& graph,
                                       const torchscript::ExportedFunction& function,
                                       const std::vector<c10::IValue>& args,
                                       MeasurementBackend& backend, RunMeasurement* result) {
  int64_t base = backend.currentMemory();
  backend.resetPeakMemory();
  PreparedArgs prepared = prepare(graph, function, args);
  std::vector<c10::IValue> outputs = executeFunction(function, std::move(prepared.args));
  prepared.args.clear();
  std::vector<at::Tensor> all;
  for (const auto& o : outputs) collectTensors(o, &all);
  result->outputBytes = distinctStorageBytes(all);
  result->inputBytes = prepared.leafBytes;
  result->keptBytes = backend.currentMemory() - base - prepared.leafBytes;
  std::vector<at::Tensor> diff = differentiable(outputs);
  std::vector<at::Tensor> ones = onesLike(diff);
  result->outputGradBytes = distinctStorageBytes(ones);
  backward(diff, ones);
  ones.clear();
  result->peakBytes = backend.peakMemory() - base - prepared.leafBytes;
  std::vector<at::Tensor> grads, inputGrads;
  for (const auto& p : prepared.params) grads.push_back(p.grad());
  result->gradientBytes = distinctStorageBytes(grads);
  for (const auto& leaf : prepared.leaves) inputGrads.push_back(leaf.grad());
  result->inputGradBytes = distinctStorageBytes(inputGrads);
  resetGrads(prepared.params);
  std::vector<c10::IValue> values;
  for (const auto& o : outputs) values.push_back(detached(o));
  return values;
}

}  // namespace

std::vector<c10::IValue> executeFunction(const torchscript::ExportedFunction& function,
                                         std::vector<c10::IValue> args) {
  gExecutions.fetch_add(1);
  std::vector<c10::IValue> outputs = function.run(std::move(args));
  // Note [Autocast cache] (frontend/torchscript/autocast.h): each run casts its own weight copies,
  // as a stage's run does; a copy cached by a run without autograd would otherwise leak into
  // later measured runs.
  torchscript::clearAutocastCacheIfEnabled();
  return outputs;
}

int64_t executionCount() { return gExecutions.load(); }

c10::IValue resizeBatch(const c10::IValue& value, int64_t fromBatch, int64_t batch) {
  if (value.isTensor()) return resizeTensor(value.toTensor(), fromBatch, batch);
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const auto& e : value.toTupleRef().elements())
      elements.push_back(resizeBatch(e, fromBatch, batch));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorVector())
      list.push_back(resizeTensor(t, fromBatch, batch));
    return list;
  }
  return value;
}

ValueMap seedValues(const torchscript::ImportedModel& model,
                    const std::vector<c10::IValue>& exampleInputs, int64_t batch) {
  const core::Graph& graph = model.graph;
  std::vector<core::ValueId> batchInputs = graph.batchInputs();
  AUTOSTAGE_CHECK(batchInputs.size() == exampleInputs.size(), "graph '", graph.name(), "' takes ",
                  batchInputs.size(), " batch inputs but ", exampleInputs.size(),
                  " example inputs were given; pass the inputs the model was imported with");
  int64_t fromBatch = exampleBatchSizeOf(exampleInputs);
  ValueMap values;
  for (size_t i = 0; i < batchInputs.size(); ++i)
    values[batchInputs[i]] = resizeBatch(exampleInputs[i], fromBatch, batch);
  std::vector<core::ValueId> params = graph.paramInputs();
  for (size_t i = 0; i < params.size(); ++i) values[params[i]] = model.paramTensors.at(i);
  return values;
}

int64_t exampleBatchSizeOf(const std::vector<c10::IValue>& inputs) {
  for (const auto& input : inputs) {
    std::vector<at::Tensor> tensors;
    collectTensors(input, &tensors);
    for (const auto& t : tensors)
      if (t.dim() > 0) return t.size(0);
  }
  return 1;
}

std::vector<c10::IValue> gatherArgs(const core::Graph& graph,
                                    const torchscript::ExportedFunction& function,
                                    const ValueMap& values) {
  std::vector<c10::IValue> args;
  for (core::ValueId v : function.inputs()) {
    auto it = values.find(v);
    AUTOSTAGE_CHECK(it != values.end(), "value '", graph.value(v).name,
                    "' is not available (its producer did not run or failed)");
    args.push_back(it->second);
  }
  return args;
}

std::string describeInputs(const core::Graph& graph, const std::vector<c10::IValue>& args,
                           const std::vector<core::ValueId>& ids) {
  std::ostringstream out;
  for (size_t i = 0; i < args.size() && i < ids.size(); ++i) {
    out << (i ? ", " : "") << graph.value(ids[i]).name << ": ";
    if (args[i].isTensor()) {
      const at::Tensor& t = args[i].toTensor();
      out << c10::toString(t.scalar_type()) << t.sizes();
    } else {
      out << args[i].tagKind();
    }
  }
  return out.str();
}

double wallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool wantsAnotherPass(int done, int passes, double started, double minSeconds) {
  return done < kMaxPasses && (done < passes || wallSeconds() - started < minSeconds);
}

namespace {

// Timed runs; the first `untimed` of them are warm-ups (not recorded).
TimedRuns runTimed(const core::Graph& graph, const torchscript::ExportedFunction& function,
                   const std::vector<c10::IValue>& args, MeasurementBackend& backend,
                   int untimed, int timed) {
  TimedRuns runs;
  for (int run = 0; run < untimed + timed; ++run) {
    PreparedArgs prepared = prepare(graph, function, args);
    std::vector<c10::IValue> results;
    double f = backend.time([&] { results = executeFunction(function, std::move(prepared.args)); });
    std::vector<at::Tensor> diff = differentiable(results);
    std::vector<at::Tensor> grads = onesLike(diff);
    double b = diff.empty() ? 0.0 : backend.time([&] { backward(diff, grads); });
    resetGrads(prepared.params);
    if (run < untimed) continue;
    runs.forward.push_back(f);
    runs.backward.push_back(b);
  }
  return runs;
}

}  // namespace

void RunMeasurement::addPass(const TimedRuns& pass) {
  passMedians.forward.push_back(median(pass.forward));
  passMedians.backward.push_back(median(pass.backward));
  forwardSeconds = *std::min_element(passMedians.forward.begin(), passMedians.forward.end());
  backwardSeconds = *std::min_element(passMedians.backward.begin(), passMedians.backward.end());
}

namespace {

// settings.repeats timed runs after `warmups` untimed ones, scaled by the load probe when
// settings.normalizeLoad; accounts the time in settings.phases.
TimedRuns timedPhase(const core::Graph& graph, const torchscript::ExportedFunction& function,
                     const std::vector<c10::IValue>& args, MeasurementBackend& backend,
                     const RunSettings& settings, PhaseTimes& phases, int warmups) {
  double start = wallSeconds();
  double scaleBefore = settings.normalizeLoad ? loadScale(backend) : 1;
  double afterProbe = wallSeconds();
  phases.loadProbes += afterProbe - start;
  TimedRuns runs = runTimed(graph, function, args, backend, warmups, settings.repeats);
  double afterRuns = wallSeconds();
  phases.timedRuns += afterRuns - afterProbe;
  double scale = settings.normalizeLoad ? (scaleBefore + loadScale(backend)) / 2 : 1;
  phases.loadProbes += wallSeconds() - afterRuns;
  for (double& t : runs.forward) t *= scale;
  for (double& t : runs.backward) t *= scale;
  return runs;
}

}  // namespace

TimedRuns timeRuns(const core::Graph& graph, const torchscript::ExportedFunction& function,
                   const std::vector<c10::IValue>& args, MeasurementBackend& backend,
                   const RunSettings& settings) {
  PhaseTimes ignored;
  return timedPhase(graph, function, args, backend, settings,
                    settings.phases ? *settings.phases : ignored, 0);
}

RunMeasurement measureRun(const core::Graph& graph, const torchscript::ExportedFunction& function,
                          const std::vector<c10::IValue>& args, MeasurementBackend& backend,
                          const RunSettings& settings, std::vector<c10::IValue>* outputs) {
  PhaseTimes ignored;
  PhaseTimes& phases = settings.phases ? *settings.phases : ignored;
  ++phases.measurements;
  RunMeasurement result;
  double start = wallSeconds();
  settle(graph, function, args, backend.settlingRuns());
  std::vector<c10::IValue> values = measureMemory(graph, function, args, backend, &result);
  if (outputs) *outputs = std::move(values);
  phases.memoryRuns += wallSeconds() - start;
  result.addPass(timedPhase(graph, function, args, backend, settings, phases, settings.warmupRuns - 1));
  return result;
}

}  // namespace autostage::profiler
