// Note [Placing the model] and the stage device of a placement. This machine has no GPU: the
// rules are tested over c10::Device values (cuda:0, cuda:1 exist as values without a GPU) and
// over CPU and meta tensors; moving CPU tensors onto a GPU runs only on a GPU machine.
#include "driver/model_device.h"

#include <algorithm>

#include <torch/torch.h>

#include "catch_torch.h"  // last: glog's CHECK must not replace Catch2's (NOTES-libtorch.md)

#include "core/error.h"
#include "driver/module.h"
#include "driver/placement.h"
#include "staging/executor.h"

namespace autostage::driver {
namespace {

using Catch::Contains;
const c10::Device kCpu(c10::DeviceType::CPU), kCuda0(c10::DeviceType::CUDA, 0),
    kCuda1(c10::DeviceType::CUDA, 1), kMeta(c10::DeviceType::Meta);

TEST_CASE("the stage device of a placement", "[driver]") {
  Placement cpu;
  CHECK(stageDeviceOf(cpu) == kCpu);
  Placement cuda;
  cuda.device.kind = DeviceKind::Cuda;
  cuda.device.index = 1;
  CHECK(stageDeviceOf(cuda) == kCuda1);
  CHECK(cuda.cudaIndex() == 1);
  CHECK(cpu.cudaIndex() == -1);
  cuda.commBackend = "mpi";  // ranks sharing a GPU: the stages still run on it
  cuda.device.index = 0;
  CHECK(stageDeviceOf(cuda) == kCuda0);
  CHECK(staging::ExecutorOptions().device == kCpu);  // what the executor makes rows on
}

TEST_CASE("placing the model: CPU tensors are placed, tensors on other devices refused",
          "[driver]") {
  // On the CPU, or already on the stages' device: placed (moved, or left as it is).
  CHECK(placementProblem("w", kCpu, kCpu).empty());
  CHECK(placementProblem("w", kCpu, kCuda0).empty());
  CHECK(placementProblem("w", kCuda1, kCuda1).empty());
  CHECK(placementProblem("w", c10::Device(c10::DeviceType::CUDA), kCuda0).empty());
  // CUDA parameters for a CPU job.
  CHECK_THAT(placementProblem("fc1.weight", kCuda0, kCpu),
             Contains("the model's tensor 'fc1.weight' is on cuda:0, but this rank's stages run "
                      "on cpu") &&
                 Contains("model.cpu()") && Contains("device=cuda"));
  // cuda:1 parameters on the rank placed at cuda:0.
  CHECK_THAT(placementProblem("fc1.bias", kCuda1, kCuda0),
             Contains("'fc1.bias' is on cuda:1, but this rank's stages run on cuda:0") &&
                 Contains("leave the model on the CPU when wrapping it (autostage moves it to "
                          "cuda:0 itself)") &&
                 Contains("cuda:(local rank mod GPU count)"));
  CHECK_THAT(placementProblem("w", kMeta, kCuda0),
             Contains("is on meta") && Contains("materialize it on the CPU first"));
}

TEST_CASE("placing tensors on the CPU moves nothing - one refused tensor refuses all", "[driver]") {
  at::Tensor weight = torch::randn({3, 2}).requires_grad_(true);
  at::Tensor buffer = torch::zeros({3});
  void* before = weight.data_ptr();
  placeTensors({{"weight", weight}, {"running_mean", buffer}}, kCpu);
  CHECK(weight.data_ptr() == before);
  CHECK(weight.device() == kCpu);

  at::Tensor stray = at::empty({2}, at::TensorOptions().device(kMeta));
  at::Tensor other = at::empty({4}, at::TensorOptions().device(kMeta));
  CHECK_THROWS_AS(placeTensors({{"weight", weight}, {"stray", stray}}, kCpu), ConfigError);
  CHECK_THROWS_WITH(placeTensors({{"weight", weight}, {"stray", stray}, {"other", other}}, kCpu),
                    Contains("the model's tensor 'stray' is on meta, but this rank's stages run "
                             "on cpu") &&
                        Contains("(1 more tensor(s) of the model are on other devices too)"));
  // Refused before anything moves (here: towards a GPU this machine does not have).
  CHECK_THROWS_AS(placeTensors({{"weight", weight}, {"stray", stray}}, kCuda0), ConfigError);
  CHECK(weight.device() == kCpu);
  CHECK(weight.data_ptr() == before);
}

TEST_CASE("the state tensors of a jit module: parameters and buffers by state_dict name",
          "[driver]") {
  torch::jit::Module inner("Inner");
  inner.register_parameter("weight", torch::ones({2}), false);
  inner.register_buffer("count", torch::zeros({1}));
  torch::jit::Module outer("Outer");
  outer.register_module("inner", inner);
  outer.register_parameter("scale", torch::ones({1}), false);
  std::vector<std::string> names;
  for (const auto& [name, t] : stateTensorsOf(outer)) names.push_back(name);
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"inner.count", "inner.weight", "scale"});
}

}  // namespace
}  // namespace autostage::driver
