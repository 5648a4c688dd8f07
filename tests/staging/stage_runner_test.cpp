#include "staging/stage_runner.h"

#include "catch_torch.h"
#include <torch/torch.h>

#include "frontend/torchscript/importer.h"

namespace autostage::staging {
namespace {

torch::jit::Module makeDropoutModel() {
  torch::jit::Module m("DropoutModel");
  m.register_parameter("w1", (torch::randn({8, 16}) * 0.3).requires_grad_(), false);
  m.register_parameter("w2", (torch::randn({16, 4}) * 0.3).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    h = torch.dropout(torch.tanh(torch.matmul(x, self.w1)), 0.5, True)
    return torch.matmul(h, self.w2)
)");
  return m;
}

struct RunResult {
  at::Tensor output;
  std::vector<at::Tensor> grads;
};

// One micro-batch through a single stage holding the whole graph; the RNG is disturbed between
// forward and backward, as other stages' work would.
RunResult runOnce(const torchscript::ImportedModel& model, bool recompute, const at::Tensor& x) {
  core::StageDeployment stage;
  stage.name = recompute ? "recompute" : "plain";
  for (core::NodeId n = 0; n < core::NodeId(model.graph.nodeCount()); ++n) stage.nodes.push_back(n);
  stage.ranks = {0};
  stage.recompute = recompute;
  ParamStorage params(model, model.graph.paramInputs());
  StageRunner runner(model.graph, stage, params, {});
  REQUIRE(runner.routedInputs() == model.graph.batchInputs());
  torch::manual_seed(5);
  std::vector<at::Tensor> out = runner.forward(0, {{runner.routedInputs()[0], x}});
  torch::rand({100});  // moves the generator on
  runner.backward(0, {torch::ones_like(out[0])});
  RunResult result{out[0].clone(), {}};
  for (const at::Tensor& p : params.parameters()) {
    result.grads.push_back(p.grad().clone());
    p.mutable_grad() = at::Tensor();
  }
  return result;
}

TEST_CASE("a recompute stage restores the RNG state: dropout masks and gradients match",
          "[staging]") {
  torch::manual_seed(4);
  torch::jit::Module m = makeDropoutModel();
  at::Tensor x = torch::randn({6, 8});
  torchscript::ImportedModel model = torchscript::importModule(m, {x});
  RunResult plain = runOnce(model, false, x);
  RunResult recomputed = runOnce(model, true, x);
  CHECK(torch::equal(plain.output, recomputed.output));
  REQUIRE(plain.grads.size() == 2);
  REQUIRE(recomputed.grads.size() == 2);
  for (size_t i = 0; i < 2; ++i) CHECK(torch::equal(plain.grads[i], recomputed.grads[i]));
  // The mask really is random: another seed gives another output.
  torch::manual_seed(6);
  CHECK_FALSE(torch::equal(m.forward({x}).toTensor(), plain.output));
}

torch::jit::Module makeBatchNormModel() {
  torch::jit::Module m("BatchNormModel");
  m.register_parameter("weight", torch::ones({4}).requires_grad_(), false);
  m.register_parameter("bias", torch::zeros({4}).requires_grad_(), false);
  m.register_buffer("running_mean", torch::zeros({4}));
  m.register_buffer("running_var", torch::ones({4}));
  m.define(R"(
def forward(self, x):
    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                            True, 0.1, 1e-5, False)
)");
  return m;
}

// A one-stage deployment of the whole graph on rank 0.
core::StageDeployment wholeGraphStage(const torchscript::ImportedModel& model, bool recompute) {
  core::StageDeployment stage;
  stage.name = "whole";
  for (core::NodeId n = 0; n < core::NodeId(model.graph.nodeCount()); ++n) stage.nodes.push_back(n);
  stage.ranks = {0};
  stage.recompute = recompute;
  return stage;
}

TEST_CASE("a recompute stage updates BatchNorm running statistics once per micro-batch",
          "[staging]") {
  for (bool recompute : {false, true}) {
    CAPTURE(recompute);
    torch::manual_seed(8);
    at::Tensor x = torch::randn({6, 4}) + 2.0;
    torch::jit::Module m = makeBatchNormModel();
    torchscript::ImportedModel model = torchscript::importModule(m, {x});
    m.attr("running_mean").toTensor().zero_();  // undo the import's trace run, if any
    m.attr("running_var").toTensor().fill_(1.0);
    ParamStorage params(model, model.graph.paramInputs());
    StageRunner runner(model.graph, wholeGraphStage(model, recompute), params, {});
    std::vector<at::Tensor> out = runner.forward(0, {{runner.routedInputs()[0], x}});
    runner.backward(0, {torch::ones_like(out[0])});
    // One momentum update with the batch's mean and unbiased variance.
    CHECK(torch::allclose(m.attr("running_mean").toTensor(), 0.1 * x.mean(0)));
    CHECK(torch::allclose(m.attr("running_var").toTensor(), 0.9 + 0.1 * x.var(0, true)));
  }
}

TEST_CASE("a stage that updates its routed input in place back-propagates, also recomputed",
          "[staging]") {
  torch::jit::Module m("InPlaceInput");
  m.register_parameter("w", (torch::randn({4, 3}) * 0.5).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    x.add_(1.0)
    return torch.matmul(x, self.w)
)");
  at::Tensor x = torch::randn({5, 4});
  torchscript::ImportedModel model = torchscript::importModule(m, {x.clone()});
  at::Tensor w = m.attr("w").toTensor();
  at::Tensor g = torch::randn({5, 3});
  for (bool recompute : {false, true}) {
    CAPTURE(recompute);
    ParamStorage params(model, model.graph.paramInputs());
    core::ValueId input = model.graph.batchInputs()[0];
    StageRunner runner(model.graph, wholeGraphStage(model, recompute), params, {input});
    at::Tensor fed = x.clone();
    std::vector<at::Tensor> out = runner.forward(0, {{input, fed}});
    auto inputGrads = runner.backward(0, {g});
    CHECK(torch::allclose(out[0], torch::matmul(x + 1.0, w.detach())));
    CHECK(torch::allclose(w.grad(), torch::matmul((x + 1.0).t(), g)));  // x + 1, not x + 2
    CHECK(torch::allclose(inputGrads.at(input), torch::matmul(g, w.detach().t())));
    w.mutable_grad() = at::Tensor();
  }
}

TEST_CASE("stageParams lists the parameters a stage reads, also through other stages' nodes",
          "[staging]") {
  torch::manual_seed(4);
  torch::jit::Module m = makeDropoutModel();
  torchscript::ImportedModel model = torchscript::importModule(m, {torch::randn({2, 8})});
  core::StageDeployment all;
  for (core::NodeId n = 0; n < core::NodeId(model.graph.nodeCount()); ++n) all.nodes.push_back(n);
  CHECK(stageParams(model.graph, all) == model.graph.paramInputs());
}

}  // namespace
}  // namespace autostage::staging
