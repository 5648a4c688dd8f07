// The profiler's pass through a model; see node_pass.h.
#include "profiler/node_pass.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <sstream>
#include <type_traits>
#include <unordered_map>
#include <variant>

#include "core/log.h"
#include "profiler/profiler.h"

namespace autostage::profiler {
namespace {

// Note [Identical node groups]
// Transformer layers and ResNet blocks repeat the same node groups: same operators, attributes
// and input types (shapes, dtypes, classes, parameter shapes included). Their costs do not
// depend on the values, so only the first group of each signature is measured; the others reuse
// its measurement at each batch size (they still run once, without autograd, to produce the
// values later groups read). A group whose representative failed at a batch is measured itself.
std::string attributeKey(const core::AttributeValue& value) {
  std::ostringstream out;
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, core::TensorData>) {
          out << "t" << static_cast<int>(v.dtype) << ":";
          for (int64_t d : v.shape) out << d << ",";
          out << std::hash<std::string>()(v.bytes);
        } else if constexpr (std::is_same_v<V, int64_t> || std::is_same_v<V, double> ||
                             std::is_same_v<V, std::string>) {
          out << v;
        } else {
          for (const auto& e : v) out << e << ",";
        }
      },
      value);
  return out.str();
}

std::string groupSignature(const core::Graph& graph, const std::vector<core::NodeId>& nodes) {
  std::unordered_map<core::ValueId, std::string> local;
  std::ostringstream out;
  int external = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const core::Node& node = graph.node(nodes[i]);
    out << node.kind << "{" << node.body << "}(";
    for (core::ValueId v : node.inputs) {
      auto it = local.find(v);
      if (it == local.end()) {  // outside values numbered by first use: add(x, x) != add(x, y)
        const core::Value& value = graph.value(v);
        std::string name = "$" + std::to_string(external++) + ":" + value.type.toString() + "/" +
                           std::to_string(int(value.cls)) +
                           (value.producer == core::kNoNode ? "/in" : "");
        it = local.emplace(v, name).first;
      }
      out << it->second << ";";
    }
    out << ")[";
    for (const core::Attribute& a : node.attributes)
      out << a.name << "=" << attributeKey(a.value) << ";";
    out << "]\n";
    for (size_t k = 0; k < node.outputs.size(); ++k)
      local[node.outputs[k]] = "%" + std::to_string(i) + "." + std::to_string(k);
  }
  return out.str();
}

// (position in `nodes`, output index) of each boundary output: where the outputs come from.
std::vector<std::pair<size_t, size_t>> outputPositions(const core::Graph& graph,
                                                       const std::vector<core::NodeId>& nodes,
                                                       const std::vector<core::ValueId>& outputs) {
  std::vector<std::pair<size_t, size_t>> positions;
  for (core::ValueId v : outputs) {
    auto at = std::find(nodes.begin(), nodes.end(), graph.value(v).producer);
    const auto& produced = graph.node(*at).outputs;
    positions.emplace_back(at - nodes.begin(),
                           std::find(produced.begin(), produced.end(), v) - produced.begin());
  }
  return positions;
}

}  // namespace

void markIdenticalGroups(const core::Graph& graph, std::vector<Unit>& units) {
  std::unordered_map<std::string, int> first;
  for (Unit& unit : units) {
    if (unit.group < 0) continue;
    auto [it, inserted] = first.emplace(groupSignature(graph, unit.nodes), unit.group);
    if (!inserted) unit.sameAs = it->second;
  }
}

// Exports every unit. A group identical to an earlier one (Note [Identical node groups]) runs
// that group's compiled function on its own values when its boundary has the same layout:
// exporting and optimizing it again cost most of a 24-layer encoder's profiling time.
void exportUnits(const core::Graph& graph, std::vector<Unit>& units) {
  std::unordered_map<int, size_t> unitOfGroup;
  for (size_t u = 0; u < units.size(); ++u) {
    Unit& unit = units[u];
    if (unit.group >= 0) unitOfGroup[unit.group] = u;
    try {
      if (unit.sameAs >= 0) {
        const Unit& first = units[unitOfGroup.at(unit.sameAs)];
        core::Boundary mine = graph.boundary(unit.nodes);
        if (first.function && mine.inputs.size() == first.function->inputs().size() &&
            outputPositions(graph, unit.nodes, mine.outputs) ==
                outputPositions(graph, first.nodes, first.function->outputs())) {
          unit.function = std::make_unique<torchscript::ExportedFunction>(
              first.function->rebind(mine.inputs, mine.outputs));
          continue;
        }
      }
      unit.function = std::make_unique<torchscript::ExportedFunction>(
          torchscript::exportSubgraph(graph, unit.nodes));
    } catch (const std::exception& e) {
      unit.exportFailure = std::string("cannot export: ") + e.what();
    }
  }
}

std::vector<Unit> buildUnits(const core::Graph& graph, const std::vector<NodeGroup>& groups) {
  std::vector<Unit> units;
  std::vector<bool> grouped(graph.nodeCount(), false);
  for (size_t g = 0; g < groups.size(); ++g) {
    units.push_back({groups[g].key, static_cast<int>(g), groups[g].nodes, nullptr, ""});
    for (core::NodeId n : groups[g].nodes) grouped[n] = true;
  }
  for (core::NodeId n = 0; n < static_cast<core::NodeId>(graph.nodeCount()); ++n)
    if (!grouped[n]) units.push_back({n, -1, {n}, nullptr, ""});
  std::sort(units.begin(), units.end(),
            [](const Unit& a, const Unit& b) { return a.last < b.last; });
  return units;
}

// The TorchScript interpreter wraps errors in a multi-line traceback; its last non-empty line
// says what went wrong (e.g. `RuntimeError: shape '[8, 16]' is invalid for input of size 256`).
// A c10::Error's what() ends in the C++ backtrace, so its message without it is read instead
// (the torch.export front end's errors, frontend/export/interpreter.cpp).
std::string lastLine(const std::exception& error) {
  const auto* c10Error = dynamic_cast<const c10::Error*>(&error);
  std::string text = c10Error ? c10Error->what_without_backtrace() : error.what();
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last.empty() ? text : last;
}

void ForwardPass::run(const std::vector<c10::IValue>& inputs, int64_t batch,
                      std::vector<GroupSamples>& samples, ProgressReporter& progress) {
  values_ = seedValues(model_, inputs, batch);
  countUses();
  saved_.clear();
  copied_.clear();
  savedStorages_.clear();
  savedBytes_ = 0;
  savingArgs_ = true;
  for (Unit& unit : units_) {
    const GroupSamples* reuse = reusable(unit, batch, samples);
    if (reuse) ++reused_;
    std::string failure =
        runUnit(unit, batch, unit.group >= 0 ? &samples[unit.group] : nullptr, reuse);
    if (unit.group >= 0) {
      if (!failure.empty()) recordFailure(unit, batch, failure, samples[unit.group]);
      progress.advance();
    }
    release(unit);
  }
  if (keep_) kept_ = std::move(values_);
  values_.clear();
}

void ForwardPass::retime(std::vector<GroupSamples>& samples) {
  for (const SavedArgs& s : saved_) {
    const Unit& unit = units_[s.unit];
    try {
      samples[unit.group].runs.back().addPass(
          timeRuns(model_.graph, *unit.function, s.args, backend_, settings_));
    } catch (const std::exception& e) {  // measured before; a later failure costs this pass only
      core::logger("Profiler")
          ->warn("{}: a later timing pass failed: {}", nodeLabel(model_.graph, unit.last),
                 lastLine(e));
    }
  }
  for (auto [group, representative] : copied_)
    samples[group].runs.back() = samples[representative].runs.back();
}

const GroupSamples* ForwardPass::reusable(const Unit& unit, int64_t batch,
                                          const std::vector<GroupSamples>& samples) {
  if (unit.sameAs < 0) return nullptr;
  const GroupSamples& first = samples[unit.sameAs];
  bool measured = !first.batches.empty() && first.batches.back() == batch;
  return measured ? &first : nullptr;
}

void ForwardPass::saveArgs(size_t index, const std::vector<c10::IValue>& args) {
  if (!savingArgs_) return;
  for (const c10::IValue& a : args) {
    if (!a.isTensor()) continue;
    const at::Tensor& t = a.toTensor();
    if (t.has_storage() && savedStorages_.insert(t.storage().unsafeGetStorageImpl()).second)
      savedBytes_ += static_cast<double>(t.storage().nbytes());
  }
  if (savedBytes_ > keptArgsBudget_) {
    savingArgs_ = false;
    saved_.clear();
    return;
  }
  saved_.push_back({index, args});
}

std::string ForwardPass::runUnit(Unit& unit, int64_t batch, GroupSamples* samples,
                                 const GroupSamples* reuse) {
  if (!unit.function) return unit.exportFailure;
  std::vector<c10::IValue> args;
  try {
    args = gatherArgs(model_.graph, *unit.function, values_);
    std::vector<c10::IValue> outputs;
    if (samples && !reuse) {
      RunMeasurement m =
          measureRun(model_.graph, *unit.function, args, backend_, settings_, &outputs);
      samples->batches.push_back(batch);
      samples->runs.push_back(m);
      saveArgs(static_cast<size_t>(&unit - units_.data()), args);
    } else {
      double start = wallSeconds();
      at::NoGradGuard noGrad;
      outputs = executeFunction(*unit.function, args);
      contextSeconds_ += wallSeconds() - start;
      if (reuse) {  // only once it ran: retime updates the copy
        samples->batches.push_back(batch);
        samples->runs.push_back(reuse->runs.back());
        copied_.emplace_back(unit.group, unit.sameAs);
      }
    }
    for (size_t i = 0; i < outputs.size(); ++i) values_[unit.function->outputs()[i]] = outputs[i];
  } catch (const std::exception& e) {
    std::string shapes = describeInputs(model_.graph, args, unit.function->inputs());
    return lastLine(e) + (shapes.empty() ? "" : " (inputs: " + shapes + ")");
  }
  return "";
}

void ForwardPass::recordFailure(const Unit& unit, int64_t batch, const std::string& failure,
                                GroupSamples& samples) {
  std::string label = nodeLabel(model_.graph, unit.last);
  core::logger("Profiler")->warn("{} failed at batch size {}: {}", label, batch, failure);
  if (samples.failure.empty()) {
    std::ostringstream out;
    out << label << " failed at batch size " << batch << ": " << failure;
    samples.failure = out.str();
    samples.failedBatch = batch;
  }
}

void ForwardPass::countUses() {
  remaining_.assign(model_.graph.valueCount(), 0);
  for (const Unit& unit : units_)
    if (unit.function)
      for (core::ValueId v : unit.function->inputs()) ++remaining_[v];
}

void ForwardPass::release(const Unit& unit) {
  if (!unit.function || keep_) return;
  for (core::ValueId v : unit.function->inputs())
    if (--remaining_[v] == 0 && !model_.graph.isGraphOutput(v)) values_.erase(v);
}

}  // namespace autostage::profiler
