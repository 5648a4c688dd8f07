// Measuring tensor-parallel patterns on one member's slices; Note [Tensor-parallel profile].
#include "profiler/split_profile.h"

#include <algorithm>
#include <exception>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "profiler/cost_model.h"
#include "profiler/profiler.h"

namespace autostage::profiler {
namespace {

// The example inputs in the order of the member graph's BATCH inputs (the rewrite orders its
// inputs by first use and leaves out those no node reads).
std::vector<c10::IValue> memberInputs(const torchscript::ImportedModel& model,
                                      const std::vector<c10::IValue>& exampleInputs,
                                      const SplitModel& split) {
  std::map<core::ValueId, size_t> position;
  const std::vector<core::ValueId> batchInputs = model.graph.batchInputs();
  for (size_t i = 0; i < batchInputs.size(); ++i) position[batchInputs[i]] = i;
  const core::Graph& member = split.model.graph;
  AUTOSTAGE_CHECK(split.inputs.size() == member.inputs().size(), "a member model of ",
                  member.inputs().size(), " inputs names ", split.inputs.size(), " originals");
  std::vector<c10::IValue> inputs;
  for (size_t i = 0; i < member.inputs().size(); ++i) {
    if (member.value(member.inputs()[i]).cls != core::ValueClass::Batch) continue;
    auto it = position.find(split.inputs[i]);
    AUTOSTAGE_CHECK(it != position.end() && it->second < exampleInputs.size(),
                    "a member model's batch input stands for no batch input of the model");
    inputs.push_back(exampleInputs[it->second]);
  }
  return inputs;
}

// Sum of the nodes' times at `batch` (forward + backward) over `nodes` of `profile`.
double stepSeconds(const core::GraphProfile& profile, const std::vector<core::NodeId>& nodes,
                   double batch) {
  double sum = 0;
  for (core::NodeId n : nodes)
    sum += profile.nodes[n].forwardSeconds.at(batch) + profile.nodes[n].backwardSeconds.at(batch);
  return sum;
}

}  // namespace

void addSplitTimes(const torchscript::ImportedModel& model,
                   const std::vector<c10::IValue>& exampleInputs, MeasurementBackend& backend,
                   const ProfilerOptions& options, const SplitModelMaker& make,
                   core::GraphProfile& profile) {
  auto log = core::logger("Profiler");
  const double batch =
      static_cast<double>(profile.batchSizes.empty() ? 1 : profile.batchSizes.back());
  for (int t : options.splitDegrees) {
    try {
      std::optional<SplitModel> split = make(t);
      if (!split) {
        log->info("tensor-parallel degree {}: no pattern splits at it; nothing to measure", t);
        continue;
      }
      AUTOSTAGE_CHECK(split->origin.size() == split->model.graph.nodeCount(),
                      "a member model names the origin of ", split->origin.size(), " of its ",
                      split->model.graph.nodeCount(), " nodes");
      // The groups keyed by a node the rewrite made of a pattern's node.
      std::vector<char> wanted(split->model.graph.nodeCount(), 0);
      for (core::NodeId n : split->measured) wanted.at(n) = 1;
      std::vector<core::NodeId> keys;
      for (const NodeGroup& g : nodeGroups(split->model.graph))
        if (wanted[g.key] && split->origin[g.key] != core::kNoNode) keys.push_back(g.key);
      log->info(
          "tensor-parallel degree {}: measuring the {} node groups of the split patterns "
          "on one member's slices",
          t, keys.size());
      const std::vector<c10::IValue> inputs = memberInputs(model, exampleInputs, *split);
      ProfilerOptions memberOptions = options;
      memberOptions.splitDegrees.clear();
      const core::GraphProfile member =
          profileNodes(split->model, inputs, backend, memberOptions, &keys);
      std::vector<core::NodeId> measured, originals;
      for (core::NodeId n : keys) {
        const core::NodeProfile& p = member.nodes.at(n);
        const core::NodeId o = split->origin[n];
        if (!p.failure.empty()) continue;  // the planner divides its whole time
        // Ascending by degree, as options.splitDegrees are (validate).
        profile.nodes.at(o).split.push_back({t, p.forwardSeconds, p.backwardSeconds});
        measured.push_back(n);
        originals.push_back(o);
      }
      const double whole = stepSeconds(profile, originals, batch);
      log->info(
          "tensor-parallel degree {}: {} node groups measured; at batch {:.0f} they take "
          "{:.3f} ms on a member, {:.2f}x of their {:.3f} ms whole (1/{} would be {:.2f}x)",
          t, measured.size(), batch, 1e3 * stepSeconds(member, measured, batch),
          whole > 0 ? stepSeconds(member, measured, batch) / whole : 0.0, 1e3 * whole, t, 1.0 / t);
    } catch (const std::exception& e) {
      log->warn(
          "tensor-parallel degree {}: not measured ({}); the planner divides the patterns' "
          "times by {}",
          t, e.what(), t);
    }
  }
}

}  // namespace autostage::profiler
