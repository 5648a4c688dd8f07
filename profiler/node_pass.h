#pragma once
// The profiler's pass through a model (used by profiler.cpp): the units it runs in order (node
// groups, measured, and nodes outside every group, run for their values), identical groups that
// share one measurement (Note [Identical node groups]), and the later timing passes of Note
// [Measurement passes] (node_runner.h).

#include <ATen/core/ivalue.h>

#include <memory>
#include <exception>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "frontend/torchscript/exporter.h"
#include "frontend/torchscript/importer.h"
#include "profiler/cost_model.h"
#include "profiler/measurement_backend.h"
#include "profiler/node_runner.h"
#include "profiler/progress.h"

namespace autostage::profiler {

// A unit of the forward pass: a node group (profiled) or a node outside every group (run only
// to produce values). Units run in order of their last node, which respects dependencies.
struct Unit {
  core::NodeId last = core::kNoNode;
  int group = -1;
  std::vector<core::NodeId> nodes;
  std::unique_ptr<torchscript::ExportedFunction> function;
  std::string exportFailure;
  int sameAs = -1;  // earlier group with an identical signature (Note [Identical node groups])
};

// Measurements of one group at each batch size (absent where it failed).
struct GroupSamples {
  std::vector<int64_t> batches;
  std::vector<RunMeasurement> runs;
  std::string failure;
  int64_t failedBatch = -1;
};

// The units of `groups` plus one per node outside every group, in running order.
std::vector<Unit> buildUnits(const core::Graph& graph, const std::vector<NodeGroup>& groups);
// Sets Unit::sameAs of every group identical to an earlier one (Note [Identical node groups]).
void markIdenticalGroups(const core::Graph& graph, std::vector<Unit>& units);
// Exports every unit (an identical group reuses its representative's compiled function when it
// can); a unit that cannot be exported keeps the reason in exportFailure.
void exportUnits(const core::Graph& graph, std::vector<Unit>& units);

class ForwardPass {
 public:
  // `keptArgsBudget`: the most bytes of measured groups' arguments kept for later passes
  // (ProfilerOptions::keptArgsBytes).
  ForwardPass(const torchscript::ImportedModel& model, std::vector<Unit>& units,
              MeasurementBackend& backend, const RunSettings& settings, double keptArgsBudget)
      : model_(model), units_(units), backend_(backend), settings_(settings),
        keptArgsBudget_(keptArgsBudget) {}

  // Runs every unit at `batch`, measuring group units into `samples` (the first pass of Note
  // [Measurement passes] in node_runner.h). Keeps the arguments of the groups it measured for
  // later passes (retime) while they fit in the budget.
  void run(const std::vector<c10::IValue>& inputs, int64_t batch,
           std::vector<GroupSamples>& samples, ProgressReporter& progress);

  // Whether retime can run (the last run's measured arguments were all kept).
  bool canRetime() const { return savingArgs_; }

  // A later pass: times every group the last run measured again, from its kept arguments, and
  // gives the groups that reuse a measurement the updated one.
  void retime(std::vector<GroupSamples>& samples);

  // Makes the next run keep every value it computes (see takeKept).
  void keepValues(bool keep) { keep_ = keep; }
  ValueMap takeKept() { return std::move(kept_); }

  // Wall time of units run only to produce values (outside every group, or reusing).
  double contextSeconds() const { return contextSeconds_; }
  // Group measurements copied from an identical group (Note [Identical node groups]).
  int64_t reusedCount() const { return reused_; }

 private:
  // The representative's measurement at `batch` when `unit` may reuse it.
  static const GroupSamples* reusable(const Unit& unit, int64_t batch,
                                      const std::vector<GroupSamples>& samples);
  // Keeps `args` of the measured unit at `index` for retime, unless the kept arguments would
  // exceed the budget (then no later pass runs at this batch size).
  void saveArgs(size_t index, const std::vector<c10::IValue>& args);
  // Runs `unit`; measures it into `samples` (copying `reuse`'s measurement at `batch` instead
  // when given). Returns "" on success, else what went wrong.
  std::string runUnit(Unit& unit, int64_t batch, GroupSamples* samples, const GroupSamples* reuse);
  void recordFailure(const Unit& unit, int64_t batch, const std::string& failure,
                     GroupSamples& samples);
  void countUses();
  // Drops values no later unit reads (graph outputs are kept).
  void release(const Unit& unit);

  const torchscript::ImportedModel& model_;
  std::vector<Unit>& units_;
  MeasurementBackend& backend_;
  RunSettings settings_;
  double keptArgsBudget_;
  ValueMap values_;
  std::vector<int> remaining_;
  double contextSeconds_ = 0;
  int64_t reused_ = 0;
  bool keep_ = false;
  ValueMap kept_;
  // For retime: arguments of the measured units, and (group, representative) of the reusing ones.
  struct SavedArgs {
    size_t unit;
    std::vector<c10::IValue> args;
  };
  std::vector<SavedArgs> saved_;
  std::vector<std::pair<int, int>> copied_;
  std::unordered_set<const void*> savedStorages_;
  double savedBytes_ = 0;
  bool savingArgs_ = true;
};

// The last non-empty line of an error's text (the interpreter's traceback ends with what went
// wrong); a c10::Error's message without its C++ backtrace.
std::string lastLine(const std::exception& error);

}  // namespace autostage::profiler
