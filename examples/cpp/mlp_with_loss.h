#pragma once
// The model and data of examples/cpp/train.cpp, shared with the plain-LibTorch reference of
// tests/consumer: an MLP (8 -> 64 -> 64 -> 4) whose forward(x, y) returns its mean squared error,
// built as TorchScript in C++, and deterministic global batches.
#include <string>
#include <utility>

#include <torch/script.h>
#include <torch/torch.h>

namespace autostage::examples {

// The optimizer both use: SGD with momentum (a state per parameter).
inline torch::optim::SGDOptions sgdOptions() { return torch::optim::SGDOptions(0.05).momentum(0.9); }

// Parameters from torch::manual_seed(seed): the same on every rank and in the reference.
inline torch::jit::Module buildMlpWithLoss(uint64_t seed = 0) {
  torch::manual_seed(seed);
  torch::jit::Module m("MlpWithLoss");
  m.register_attribute("training", c10::BoolType::get(), true);  // train()/eval(), as scripted
  const int64_t sizes[] = {8, 64, 64, 4};
  for (int i = 0; i < 3; ++i) {
    std::string n = std::to_string(i);
    m.register_parameter("w" + n, (torch::randn({sizes[i], sizes[i + 1]}) * 0.2).requires_grad_(),
                         false);
    m.register_parameter("b" + n, torch::zeros({sizes[i + 1]}).requires_grad_(), false);
  }
  m.define(R"(
def forward(self, x, y):
    h = torch.relu(torch.matmul(x, self.w0) + self.b0)
    h = torch.relu(torch.matmul(h, self.w1) + self.b1)
    out = torch.matmul(h, self.w2) + self.b2
    return torch.mean((out - y) * (out - y))
)");
  return m;
}

// The global batch of `step`: `rows` samples (x [rows, 8], y [rows, 4]); rank r of a job feeds
// rows [r * local, (r + 1) * local).
inline std::pair<at::Tensor, at::Tensor> globalBatch(int step, int64_t rows) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor x = at::randn({rows, 8}, generator);
  at::Tensor y = at::randn({rows, 4}, generator);
  return {x, y};
}

}  // namespace autostage::examples
