// C++ example: train a TorchScript model with autostage across MPI ranks.
//
//   mpirun --allow-run-as-root --oversubscribe -np 4 -x OMP_NUM_THREADS=1
//          build/examples/cpp/autostage_train_example [model.pt|-]
//
// Without model.pt a small MLP (8 -> 64 -> 64 -> 4) is built in place. Every rank feeds its own
// local batch of 16 random samples; the wrapped module returns the rows of that local batch and
// the ordinary `loss.backward()` drives the pipeline backward and gradient synchronisation.
// Rank 0 profiles the model and plans stages with the decomposer (options from the config table,
// e.g. AUTOSTAGE_PARTITION_NUM=2 to force two stages); the partition log shows what it chose.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/script.h>
#include <torch/torch.h>

#include "bindings/cpp/module.h"

namespace {

torch::jit::Module builtinMlp() {
  torch::jit::Module m("Mlp");
  const int64_t sizes[] = {8, 64, 64, 4};
  for (int i = 0; i < 3; ++i) {
    std::string n = std::to_string(i);
    m.register_parameter("w" + n, (torch::randn({sizes[i], sizes[i + 1]}) * 0.2).requires_grad_(), false);
    m.register_parameter("b" + n, torch::zeros({sizes[i + 1]}).requires_grad_(), false);
  }
  m.define(R"(
def forward(self, x):
    h = torch.relu(torch.matmul(x, self.w0) + self.b0)
    h = torch.relu(torch.matmul(h, self.w1) + self.b1)
    return torch.matmul(h, self.w2) + self.b2
)");
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace autostage;
  torch::manual_seed(0);
  torch::jit::Module model = argc > 1 && std::string(argv[1]) != "-" ? torch::jit::load(argv[1])
                                                                      : builtinMlp();
  try {
    autostage::Module module(model);
    const int64_t localBatch = 16;
    for (int step = 0; step < 5; ++step) {
      at::Tensor x = torch::randn({localBatch, 8});
      at::Tensor y = torch::randn({localBatch, 4});
      at::Tensor out = module.forward({x})[0];
      at::Tensor loss = torch::mse_loss(out, y);
      loss.backward();
      torch::NoGradGuard noGrad;
      for (const at::Tensor& p : module.parameters()) {
        p.sub_(0.05 * p.grad());
        p.mutable_grad().zero_();
      }
      if (module.rank() == 0) std::printf("step %d loss %.5f\n", step, loss.item<double>());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
