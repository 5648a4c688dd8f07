// Mixed precision in a stage (Note [Autocast execution], Note [Autocast cache]).
#include "catch_torch.h"
#include <torch/torch.h>

#include "core/error.h"
#include "frontend/torchscript/autocast.h"
#include "frontend/torchscript/importer.h"
#include "staging/stage_runner.h"

namespace autostage::staging {
namespace {

torch::jit::Module makeMatmulModel() {
  torch::jit::Module m("MatmulModel");
  m.register_parameter("w1", (torch::randn({8, 16}) * 0.3).requires_grad_(), false);
  m.register_parameter("w2", (torch::randn({16, 4}) * 0.3).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    return torch.matmul(torch.tanh(torch.matmul(x, self.w1)), self.w2)
)");
  return m;
}

struct RunResult {
  at::Tensor output;
  std::vector<at::Tensor> grads;
};

RunResult runStage(const torchscript::ImportedModel& model, bool recompute, const at::Tensor& x) {
  core::StageDeployment stage;
  stage.name = "whole";
  for (core::NodeId n = 0; n < core::NodeId(model.graph.nodeCount()); ++n) stage.nodes.push_back(n);
  stage.ranks = {0};
  stage.recompute = recompute;
  ParamStorage params(model, model.graph.paramInputs());
  StageRunner runner(model.graph, stage, params, {}, core::Precision::Bf16);
  std::vector<at::Tensor> out = runner.forward(0, {{runner.routedInputs()[0], x}});
  runner.backward(0, {torch::ones_like(out[0])});
  RunResult result{out[0], {}};
  for (const at::Tensor& p : params.parameters()) {
    REQUIRE(p.scalar_type() == at::kFloat);  // master weights
    result.grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    p.mutable_grad() = at::Tensor();
  }
  return result;
}

}  // namespace

TEST_CASE("a bf16 stage computes what eager autocast computes, recomputed or not", "[staging]") {
  torch::manual_seed(3);
  torch::jit::Module m = makeMatmulModel();
  at::Tensor x = torch::randn({6, 8});
  torchscript::ImportedModel model = [&] {
    torchscript::AutocastGuard autocast(core::Precision::Bf16, c10::kCPU);
    return torchscript::importModule(m, {x});
  }();
  // The import probe recorded the dtype autocast produces: the output travels as bf16.
  CHECK(model.graph.value(model.graph.outputs()[0]).type.dtype() == core::DType::BFloat16);

  // Eager reference on copies of the weights (the stage shares the module's own tensors).
  at::Tensor w1 = m.attr("w1").toTensor().detach().clone().requires_grad_(true);
  at::Tensor w2 = m.attr("w2").toTensor().detach().clone().requires_grad_(true);
  at::Tensor expected;
  {
    torchscript::AutocastGuard autocast(core::Precision::Bf16, c10::kCPU);
    expected = torch::matmul(torch::tanh(torch::matmul(x, w1)), w2);
  }
  expected.backward(torch::ones_like(expected));  // a contiguous gradient, as the stage gets
  REQUIRE(expected.scalar_type() == at::kBFloat16);

  for (bool recompute : {true, false}) {
    INFO("recompute=" << recompute);
    RunResult r = runStage(model, recompute, x);
    CHECK(r.output.scalar_type() == at::kBFloat16);
    CHECK(torch::equal(r.output, expected.detach()));
    // The recompute stage's re-run must reach the weights (Note [Autocast cache]: a weight copy
    // cached by its no-grad forward would have no autograd history).
    REQUIRE(r.grads.size() == 2);
    REQUIRE(r.grads[0].defined());
    REQUIRE(r.grads[1].defined());
    for (const at::Tensor& g : r.grads) {  // in ParamStorage order: match by shape
      const at::Tensor& expectedGrad = g.sizes() == w1.sizes() ? w1.grad() : w2.grad();
      CHECK(g.scalar_type() == at::kFloat);
      CHECK(torch::equal(g, expectedGrad));
    }
  }
}

TEST_CASE("the autocast guard restores the caller's state, and runs fp16 on the CPU where it can",
          "[staging]") {
  REQUIRE_FALSE(torchscript::isAutocastEnabled(c10::kCPU));
  {
    torchscript::AutocastGuard autocast(core::Precision::Bf16, c10::kCPU);
    CHECK(torchscript::isAutocastEnabled(c10::kCPU));
    CHECK(torchscript::currentAutocastDtype(c10::kCPU) == at::kBFloat16);
    CHECK(torch::matmul(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == at::kBFloat16);
  }
  CHECK_FALSE(torchscript::isAutocastEnabled(c10::kCPU));
  {
    torchscript::AutocastGuard none(core::Precision::Fp32, c10::kCPU);
    CHECK_FALSE(torchscript::isAutocastEnabled(c10::kCPU));
  }
  if (torchscript::cpuAutocastSupportsFp16()) {  // Note [fp16 on the CPU]: LibTorch 2.5 or later
    {
      torchscript::AutocastGuard fp16(core::Precision::Fp16, c10::kCPU);
      CHECK(torchscript::currentAutocastDtype(c10::kCPU) == at::kHalf);
      CHECK(torch::matmul(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type() == at::kHalf);
      // Kept in fp32 by the CPU's list, as plain autocast keeps it.
      CHECK(torch::layer_norm(torch::ones({2, 4}), {4}).scalar_type() == at::kFloat);
    }
    CHECK(torchscript::currentAutocastDtype(c10::kCPU) != at::kHalf);
  } else {
    CHECK_THROWS_AS(torchscript::AutocastGuard(core::Precision::Fp16, c10::kCPU), UnsupportedError);
    CHECK_THROWS_WITH(torchscript::AutocastGuard(core::Precision::Fp16, c10::kCPU),
                      Catch::Contains("use precision=bf16 on the CPU"));
  }
  CHECK_FALSE(torchscript::isAutocastEnabled(c10::kCPU));
  CHECK_NOTHROW(torchscript::checkAutocastSupported(core::Precision::Fp16, c10::DeviceType::CUDA));
}

TEST_CASE("the autocast state wrappers read and set each device's state", "[staging]") {
  // Note [Autocast API versions]: the same calls on LibTorch 1.13 and 2.x; the CUDA state is
  // thread-local dispatch state, settable without a GPU.
  for (c10::DeviceType device : {c10::kCPU, c10::kCUDA}) {
    const bool enabled = torchscript::isAutocastEnabled(device);
    const c10::ScalarType dtype = torchscript::currentAutocastDtype(device);
    // LibTorch 1.13's CPU autocast accepts only bfloat16.
    const c10::ScalarType low = device == c10::kCPU ? at::kBFloat16 : at::kHalf;
    torchscript::setAutocastDtype(device, low);
    torchscript::setAutocastEnabled(device, true);
    CHECK(torchscript::isAutocastEnabled(device));
    CHECK(torchscript::currentAutocastDtype(device) == low);
    torchscript::clearAutocastCacheIfEnabled();
    torchscript::setAutocastEnabled(device, enabled);
    torchscript::setAutocastDtype(device, dtype);
    CHECK(torchscript::isAutocastEnabled(device) == enabled);
    CHECK(torchscript::currentAutocastDtype(device) == dtype);
  }
  {
    torchscript::AutocastGuard outer(core::Precision::Bf16, c10::kCPU);
    { torchscript::AutocastGuard inner(core::Precision::Fp16, c10::kCUDA); }
    CHECK(torchscript::isAutocastEnabled(c10::kCPU));  // the inner guard left the CPU state alone
    CHECK_FALSE(torchscript::isAutocastEnabled(c10::kCUDA));
  }
  CHECK_FALSE(torchscript::isAutocastEnabled(c10::kCPU));
}

}  // namespace autostage::staging
