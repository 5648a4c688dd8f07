// Plain LibTorch training of examples/cpp/train.cpp's model and data in one process, for
// comparison: the global batch of every step, the same optimizer, then the held-out batch in eval
// mode. Prints `step N loss X` and `eval loss X` and writes the parameters like train.cpp's
// --save-params.
//
//   reference WORLD_SIZE STEPS PARAMS_PATH
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include <torch/script.h>
#include <torch/torch.h>

#include "mlp_with_loss.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: reference WORLD_SIZE STEPS PARAMS_PATH\n");
    return 2;
  }
  const int world = std::atoi(argv[1]), steps = std::atoi(argv[2]);
  torch::jit::Module model = autostage::examples::buildMlpWithLoss();
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : model.parameters()) params.push_back(p);
  torch::optim::SGD optimizer(params, autostage::examples::sgdOptions());
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = autostage::examples::globalBatch(step, 16 * world);
    at::Tensor loss = model.forward({x, y}).toTensor();
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    std::printf("step %d loss %.9g\n", step, loss.item<double>());
  }
  model.eval();
  {
    torch::NoGradGuard noGrad;
    auto [x, y] = autostage::examples::globalBatch(-1, 16 * world);
    std::printf("eval loss %.9g\n", model.forward({x, y}).toTensor().item<double>());
  }
  std::ofstream out(argv[3]);
  out.precision(9);
  for (const auto& named : model.named_parameters()) {
    out << named.name;
    at::Tensor flat = named.value.contiguous().view(-1);
    for (int64_t i = 0; i < flat.numel(); ++i) out << ' ' << flat[i].item<double>();
    out << '\n';
  }
  return 0;
}
