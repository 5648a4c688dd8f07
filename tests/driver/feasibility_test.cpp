// A node that failed during profiling makes plans that run it at a larger micro-batch fail with
// a PlanError naming the node and its input shapes (driver/auto_planner.h).
#include "catch_torch.h"

#include "service/plan_call.h"
#include "core/error.h"
#include "profiler/profiler.h"
#include "test_models.h"

using namespace autostage;
using namespace autostage::profiler;
using autostage::service::checkProfiledFeasibility;

namespace {

core::Deployment oneStage(const core::Graph& graph, int64_t batch, int microBatches,
                          std::vector<int> ranks) {
  core::Deployment d;
  d.batchSize = batch;
  d.microBatchCount = microBatches;
  d.worldSize = static_cast<int>(ranks.size());
  core::StageDeployment stage;
  stage.name = "STAGE_0_0";
  for (core::NodeId n = 0; n < static_cast<core::NodeId>(graph.nodeCount()); ++n)
    stage.nodes.push_back(n);
  stage.ranks = std::move(ranks);
  d.stages.push_back(stage);
  return d;
}

}  // namespace

TEST_CASE("plans running a failed node above its largest batch are refused", "[profiler]") {
  torch::manual_seed(5);
  testing::TestModel m = testing::makeBatchEightOnlyModel();
  torchscript::ImportedModel model = torchscript::importModule(m.module, m.inputs);
  auto backend = createCpuMeasurementBackend();
  ProfilerOptions options;
  options.repeats = 3;
  options.progressBar = false;
  options.batchSizes = {8, 16};
  core::GraphProfile profile = profileNodes(model, m.inputs, *backend, options);
  const core::Graph& graph = model.graph;

  // Micro-batch 16 (one micro-batch, one replica): the reshape failed there.
  CHECK_THROWS_AS(checkProfiledFeasibility(graph, profile, oneStage(graph, 16, 1, {0})),
                  PlanError);
  CHECK_THROWS_WITH(checkProfiledFeasibility(graph, profile, oneStage(graph, 16, 1, {0})),
                    Catch::Contains("STAGE_0_0") && Catch::Contains("aten::reshape") &&
                        Catch::Contains("micro-batch size 16") &&
                        Catch::Contains("Float[16, 16]"));
  // Micro-batch 8, by two micro-batches or by two replicas: it ran there.
  CHECK_NOTHROW(checkProfiledFeasibility(graph, profile, oneStage(graph, 16, 2, {0})));
  CHECK_NOTHROW(checkProfiledFeasibility(graph, profile, oneStage(graph, 16, 1, {0, 1})));
  // Micro-batch 9 (ceil of 17 / 2) is beyond what ran.
  CHECK_THROWS_AS(checkProfiledFeasibility(graph, profile, oneStage(graph, 17, 2, {0})),
                  PlanError);
}
