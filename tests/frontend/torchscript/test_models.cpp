#include "test_models.h"

#include <unordered_map>

namespace autostage::torchscript::testing {
namespace {

torch::jit::Module makeLinear(int64_t in, int64_t out) {
  torch::jit::Module m("Linear");
  m.register_parameter("weight", torch::randn({out, in}).requires_grad_(), false);
  m.register_parameter("bias", torch::randn({out}).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    return torch.matmul(x, self.weight.t()) + self.bias
)");
  return m;
}

}  // namespace

torch::jit::Module makeMlp() {
  torch::jit::Module m("Mlp");
  m.register_module("fc1", makeLinear(8, 16));
  m.register_module("fc2", makeLinear(16, 3));
  m.define(R"(
def forward(self, x):
    return self.fc2.forward(torch.relu(self.fc1.forward(x)))
)");
  return m;
}

torch::jit::Module makeLoopModel() {
  torch::jit::Module m("LoopModel");
  m.register_parameter("w", (torch::randn({8, 8}) * 0.3).requires_grad_(), false);
  m.register_parameter("b", torch::randn({8}).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    h = torch.relu(x)
    for i in range(3):
        h = torch.tanh(torch.matmul(h, self.w)) + self.b * i
    return h * 2.0
)");
  return m;
}

torch::jit::Module makeInPlaceLoopModel() {
  torch::jit::Module m("InPlaceLoopModel");
  m.register_parameter("w", (torch::randn({8, 8}) * 0.5).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    assert x.size(0) > 0, "empty batch"
    h = torch.matmul(x, self.w) + 0.0
    for row in h:
        for i in range(row.numel()):
            if bool(row[i] > 0.5):
                row[i] = 0.5
    return torch.tanh(h) * 2.0
)");
  return m;
}

torch::jit::Module makeDictOutputModel() {
  torch::jit::Module m("DictModel");
  m.define(R"(
def forward(self, x):
    return {"out": x * 2.0}
)");
  return m;
}

torch::jit::Module makeKwargModel() {
  torch::jit::Module m("KwargModel");
  m.define(R"(
def forward(self, x, *, scale: float):
    return x * scale
)");
  return m;
}

std::vector<at::Tensor> runChained(const ImportedModel& model,
                                   const std::vector<c10::IValue>& inputs,
                                   const std::vector<std::vector<core::NodeId>>& parts) {
  std::unordered_map<core::ValueId, c10::IValue> env;
  std::vector<core::ValueId> batch = model.graph.batchInputs();
  for (size_t i = 0; i < batch.size(); ++i) env[batch[i]] = inputs.at(i);
  std::vector<core::ValueId> params = model.graph.paramInputs();
  for (size_t i = 0; i < params.size(); ++i) env[params[i]] = model.paramTensors.at(i);
  for (const auto& part : parts) {
    ExportedFunction fn = exportSubgraph(model.graph, part);
    std::vector<c10::IValue> args;
    for (core::ValueId v : fn.inputs()) args.push_back(env.at(v));
    std::vector<c10::IValue> results = fn.run(args);
    for (size_t i = 0; i < results.size(); ++i) env[fn.outputs()[i]] = results[i];
  }
  std::vector<at::Tensor> outputs;
  for (core::ValueId v : model.graph.outputs()) outputs.push_back(env.at(v).toTensor());
  return outputs;
}

std::vector<core::NodeId> nodeRange(core::NodeId begin, core::NodeId end) {
  std::vector<core::NodeId> ids;
  for (core::NodeId i = begin; i < end; ++i) ids.push_back(i);
  return ids;
}

std::map<std::string, at::Tensor> gradientsOf(const ImportedModel& model,
                                              const std::vector<at::Tensor>& outputs) {
  at::Tensor loss = at::zeros({});
  for (const auto& out : outputs) loss = loss + out.pow(2).sum();
  loss.backward();
  std::map<std::string, at::Tensor> grads;
  for (size_t i = 0; i < model.paramTensors.size(); ++i) {
    at::Tensor p = model.paramTensors[i];
    if (!p.requires_grad()) continue;
    grads[model.paramNames[i]] = p.grad().clone();
    p.mutable_grad() = at::Tensor();
  }
  return grads;
}

}  // namespace autostage::torchscript::testing
