// C++ example: train a TorchScript model with autostage across MPI ranks.
//
//   mpirun -np 4 -x OMP_NUM_THREADS=1 autostage_train_example [model.pt|-] [--steps N]
//          [--save-params PATH]
//
// Without model.pt the MLP of mlp_with_loss.h is built in place; a model.pt must take (x [B, 8],
// y [B, 4]) and return its mean loss, like that one. Every rank feeds its rows of the global
// batch (16 per rank); the wrapped module returns the loss of the global batch on every rank
// (Note [Loss outputs]) and `loss.backward()` drives the pipeline backward and the gradient
// synchronisation. The optimizer (torch::optim::SGD with momentum) is made after the first step
// over module.parameters(): this rank's parameters, known once the plan is deployed. Rank 0
// profiles the model and plans stages (options from the config table, e.g.
// AUTOSTAGE_PARTITION_NUM=2); the partition log shows what it chose. Rank 0 prints
// `step N loss X`, then, after module.eval(), the loss of a held-out batch under NoGradGuard
// (`eval loss X`: an inference deployment, planned once); with --save-params it writes every
// parameter, gathered from the stages, as `name v0 v1 ...` lines.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include <torch/script.h>
#include <torch/torch.h>

#include "bindings/cpp/module.h"
#include "mlp_with_loss.h"

int main(int argc, char** argv) {
  std::string modelPath = "-", paramsPath;
  int steps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (arg == "--save-params" && i + 1 < argc) {
      paramsPath = argv[++i];
    } else {
      modelPath = arg;
    }
  }
  try {
    torch::jit::Module model = modelPath != "-" ? torch::jit::load(modelPath)
                                                : autostage::examples::buildMlpWithLoss();
    autostage::Module module(model);
    const int64_t localBatch = 16;
    const int64_t first = localBatch * module.rank();
    std::unique_ptr<torch::optim::SGD> optimizer;  // over this rank's parameters, once deployed
    for (int step = 0; step < steps; ++step) {
      auto [x, y] = autostage::examples::globalBatch(step, localBatch * module.worldSize());
      at::Tensor loss = module.forward({x.narrow(0, first, localBatch),
                                        y.narrow(0, first, localBatch)})[0];
      loss.backward();
      if (!optimizer) {
        optimizer = std::make_unique<torch::optim::SGD>(module.parameters(),
                                                        autostage::examples::sgdOptions());
      }
      optimizer->step();
      optimizer->zero_grad();
      if (module.rank() == 0) std::printf("step %d loss %.9g\n", step, loss.item<double>());
    }
    module.eval();
    {
      torch::NoGradGuard noGrad;
      auto [x, y] = autostage::examples::globalBatch(-1, localBatch * module.worldSize());
      at::Tensor loss = module.forward({x.narrow(0, first, localBatch),
                                        y.narrow(0, first, localBatch)})[0];
      if (module.rank() == 0) std::printf("eval loss %.9g\n", loss.item<double>());
    }
    auto state = module.stateDict();  // collective: every rank gathers the whole model
    if (!paramsPath.empty() && module.rank() == 0) {
      std::ofstream out(paramsPath);
      out.precision(9);
      for (const auto& [name, tensor] : state) {
        out << name;
        at::Tensor flat = tensor.contiguous().view(-1);
        for (int64_t i = 0; i < flat.numel(); ++i) out << ' ' << flat[i].item<double>();
        out << '\n';
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
