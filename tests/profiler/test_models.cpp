#include "test_models.h"

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

namespace autostage::profiler::testing {
namespace {

torch::jit::Module makeLinear(int64_t in, int64_t out) {
  torch::jit::Module m("Linear");
  m.register_parameter("weight", (torch::randn({out, in}) / std::sqrt(in)).requires_grad_(), false);
  m.register_parameter("bias", torch::zeros({out}).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    return torch.addmm(self.bias, x, self.weight.t())
)");
  return m;
}

}  // namespace

TestModel makeMlp(int64_t width, int depth, int64_t batch) {
  torch::jit::Module m("Mlp");
  std::string body = "def forward(self, x):\n    h = x\n";
  for (int i = 0; i < depth; ++i) {
    std::string name = "fc" + std::to_string(i);
    m.register_module(name, makeLinear(width, width));
    body += "    h = torch.relu(self." + name + ".forward(h))\n";
  }
  body += "    return h.sum()\n";
  m.define(body);
  return {m, {torch::randn({batch, width})}};
}

TestModel makeBatchEightOnlyModel() {
  torch::jit::Module m("EightOnly");
  m.register_module("fc1", makeLinear(16, 16));
  m.register_module("fc2", makeLinear(16, 16));
  m.define(R"(
def forward(self, x):
    h = self.fc1.forward(x)
    h = h.reshape(8, 16)
    return self.fc2.forward(h)
)");
  return {m, {torch::randn({8, 16})}};
}

TestModel makeFailureBeforeIdenticalModel() {
  torch::jit::Module m("FailureBeforeIdentical");
  m.register_module("fc1", makeLinear(16, 16));
  m.register_module("fc2", makeLinear(16, 16));
  m.register_module("fc3", makeLinear(16, 16));
  m.define(R"(
def forward(self, x):
    h = self.fc2.forward(self.fc1.forward(x))
    h = h.reshape(8, 16)
    return self.fc3.forward(h)
)");
  return {m, {torch::randn({8, 16})}};
}

std::string tracedModelDir() {
  return AUTOSTAGE_TEST_MODEL_DIR;
}

TestModel loadTracedModel(const std::string& name) {
  std::string dir = tracedModelDir();
  std::string model = dir + "/" + name + ".pt", input = dir + "/" + name + ".input.pt";
  if (!std::filesystem::exists(model) || !std::filesystem::exists(input)) {
    std::string command = std::string(AUTOSTAGE_PYTHON_EXECUTABLE) + " " + AUTOSTAGE_SOURCE_DIR +
                          "/tests/profiler/make_models.py " + dir + " " + name;
    if (std::system(command.c_str()) != 0)
      throw std::runtime_error("could not create test model: " + command);
  }
  torch::jit::Module module = torch::jit::load(model);
  torch::jit::Module inputs = torch::jit::load(input);
  return {module, {inputs.attr("x").toTensor()}};
}

}  // namespace autostage::profiler::testing
