#include "staging/param_storage.h"

#include "catch_torch.h"
#include <torch/torch.h>

#include "comm/thread_backend.h"
#include "frontend/torchscript/importer.h"
#include "test_support.h"

namespace autostage::staging {
namespace {

torch::jit::Module withBuffer() {
  torch::jit::Module m("WithBuffer");
  m.register_parameter("weight", torch::randn({4, 4}).requires_grad_(), false);
  m.register_buffer("running", torch::zeros({4}));
  m.define(R"(
def forward(self, x):
    self.running.add_(torch.mean(x, 0))
    return torch.matmul(x, self.weight) + self.running
)");
  return m;
}

TEST_CASE("ParamStorage holds the module's own tensors, parameters and buffers", "[staging]") {
  torch::jit::Module m = withBuffer();
  torchscript::ImportedModel model = torchscript::importModule(m, {torch::randn({2, 4})});
  std::vector<core::ValueId> ids = model.graph.paramInputs();
  REQUIRE(ids.size() == 2);
  ParamStorage storage(model, ids);
  at::Tensor weight = m.attr("weight").toTensor();
  at::Tensor running = m.attr("running").toTensor();
  bool sawWeight = false, sawRunning = false;
  for (core::ValueId id : storage.ids()) {
    const at::Tensor& t = storage.tensor(id);
    if (storage.name(id) == "weight") sawWeight = t.data_ptr() == weight.data_ptr();
    if (storage.name(id) == "running") sawRunning = t.data_ptr() == running.data_ptr();
  }
  CHECK(sawWeight);
  CHECK(sawRunning);
  REQUIRE(storage.parameters().size() == 1);  // the buffer does not require grad
  CHECK(storage.parameters()[0].data_ptr() == weight.data_ptr());

  ParamStorage partial(model, {ids[0]});
  CHECK(partial.has(ids[0]));
  CHECK_FALSE(partial.has(ids[1]));
}

TEST_CASE("synchronize copies rank 0's parameters and buffers to every rank", "[staging]") {
  std::vector<torch::jit::Module> modules;
  for (int r = 0; r < 3; ++r) modules.push_back(withBuffer());  // different random weights
  at::Tensor rank0Weight = modules[0].attr("weight").toTensor().clone();
  {
    torch::NoGradGuard noGrad;
    modules[0].attr("running").toTensor().fill_(7);
  }
  testing::rethrowFirst(comm::runThreadRanks(3, [&](comm::ThreadBackend& backend) {
    torch::jit::Module& m = modules[backend.rank()];
    torchscript::ImportedModel model = torchscript::importModule(m, {torch::randn({2, 4})});
    ParamStorage::synchronize(model, backend);
  }));
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(torch::equal(modules[r].attr("weight").toTensor(), rank0Weight));
    CHECK(torch::equal(modules[r].attr("running").toTensor(), torch::full({4}, 7.0)));
  }
}

}  // namespace
}  // namespace autostage::staging
