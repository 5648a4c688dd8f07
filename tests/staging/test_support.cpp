#include "test_support.h"

#include <set>
#include <stdexcept>

namespace autostage::staging::testing {

torch::jit::Module makeLinear(int64_t in, int64_t out) {
  torch::jit::Module m("Linear");
  m.register_parameter("weight", (torch::randn({out, in}) * 0.4).requires_grad_(), false);
  m.register_parameter("bias", (torch::randn({out}) * 0.1).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    return torch.matmul(x, self.weight.t()) + self.bias
)");
  return m;
}

namespace {

void addMlpLayers(torch::jit::Module& m) {
  m.register_module("fc1", makeLinear(8, 16));
  m.register_module("fc2", makeLinear(16, 16));
  m.register_module("fc3", makeLinear(16, 4));
}

}  // namespace

torch::jit::Module makeMlp() {
  torch::jit::Module m("Mlp");
  addMlpLayers(m);
  m.define(R"(
def forward(self, x):
    h = torch.tanh(self.fc1.forward(x))
    h = torch.relu(self.fc2.forward(h))
    return self.fc3.forward(h)
)");
  return m;
}

torch::jit::Module makeLossMlp() {
  torch::jit::Module m("LossMlp");
  addMlpLayers(m);
  m.define(R"(
def forward(self, x, y):
    h = torch.tanh(self.fc1.forward(x))
    h = torch.relu(self.fc2.forward(h))
    out = self.fc3.forward(h)
    return torch.mean((out - y) * (out - y))
)");
  return m;
}

torch::jit::Module makeTiedModel() {
  torch::jit::Module m("Tied");
  m.register_parameter("shared", (torch::randn({8, 8}) * 0.4).requires_grad_(), false);
  m.register_module("mid", makeLinear(8, 8));
  m.define(R"(
def forward(self, x):
    h = torch.tanh(torch.matmul(x, self.shared))
    h = torch.tanh(self.mid.forward(h))
    h = torch.sigmoid(self.mid.forward(h))
    return torch.matmul(h, self.shared.t())
)");
  return m;
}

torch::jit::Module makeTiedLossModel() {
  torch::jit::Module m("TiedLoss");
  m.register_parameter("shared", (torch::randn({8, 8}) * 0.4).requires_grad_(), false);
  m.register_module("mid", makeLinear(8, 8));
  m.define(R"(
def forward(self, x, y):
    h = torch.tanh(torch.matmul(x, self.shared))
    h = torch.tanh(self.mid.forward(h))
    h = torch.sigmoid(self.mid.forward(h))
    out = torch.matmul(h, self.shared.t()).narrow(1, 0, 4)
    return torch.mean((out - y) * (out - y))
)");
  return m;
}

core::Deployment makeDeployment(const core::Graph& graph,
                                const std::vector<std::vector<int>>& ranks, int worldSize,
                                int microBatchCount, const std::string& schedule,
                                const std::vector<bool>& recompute, int virtualStages) {
  core::Deployment d;
  d.worldSize = worldSize;
  d.virtualStages = virtualStages;
  d.microBatchCount = microBatchCount;
  d.schedule = schedule;
  const int stages = static_cast<int>(ranks.size());
  const int n = static_cast<int>(graph.nodeCount());
  std::vector<int> stageOf(n);
  for (int s = 0; s < stages; ++s) {
    core::StageDeployment stage;
    stage.id = s;
    stage.name = "STAGE_" + std::to_string(s);
    for (int node = n * s / stages; node < n * (s + 1) / stages; ++node) {
      stage.nodes.push_back(node);
      stageOf[node] = s;
    }
    stage.ranks = ranks[s];
    stage.recompute = s < int(recompute.size()) && recompute[s];
    d.stages.push_back(stage);
  }
  for (const core::Value& v : graph.values()) {
    if (v.cls != core::ValueClass::Batch && v.cls != core::ValueClass::Loss) continue;
    int producer = v.producer == core::kNoNode ? core::kFeederStage : stageOf[v.producer];
    std::set<int> consumers;
    for (const core::Use& use : v.uses)
      if (stageOf[use.node] != producer) consumers.insert(stageOf[use.node]);
    bool output = graph.isGraphOutput(v.id);
    if (consumers.empty() && !output) continue;
    core::Route route;
    route.value = v.id;
    route.producerStage = producer;
    route.consumerStages.assign(consumers.begin(), consumers.end());
    route.graphOutput = output;
    route.carriesGradient = v.type.isTensor() && core::isFloatingPoint(v.type.dtype());
    d.routes.push_back(route);
  }
  return d;
}

std::map<std::string, at::Tensor> takeGradients(const torch::jit::Module& module) {
  std::map<std::string, at::Tensor> grads;
  for (const auto& p : module.named_parameters(true)) {
    grads[p.name] = p.value.grad().defined() ? p.value.grad().clone() : at::zeros_like(p.value);
    p.value.mutable_grad() = at::Tensor();
  }
  return grads;
}

std::shared_ptr<comm::Backend> borrow(comm::Backend& backend) {
  return std::shared_ptr<comm::Backend>(&backend, [](comm::Backend*) {});
}

std::mutex& assertionMutex() {
  static std::mutex mutex;
  return mutex;
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

void rethrowFirst(const std::vector<std::exception_ptr>& errors) {
  for (size_t rank = 0; rank < errors.size(); ++rank) {
    if (!errors[rank]) continue;
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const std::exception& e) {
      throw std::runtime_error("rank " + std::to_string(rank) + ": " + e.what());
    }
  }
}

bool allClose(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  // On the CPU: a deployment on a GPU compares its tensors with a CPU reference.
  return a.sizes() == b.sizes() && at::allclose(a.cpu(), b.cpu(), rtol, atol);
}

}  // namespace autostage::staging::testing
