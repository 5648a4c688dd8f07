#pragma once
// ZeRO-1 for the C++ API (autostage::Module with shardsOptimizer = true).
//
// Note [ZeRO-1 in the C++ API]
// Under ZeRO-1 (Note [ZeRO-1] in staging/gradient_sync.h) a replica steps only the pieces of its
// parameters it owns, and the stepped pieces are all-gathered into every replica afterwards. A
// torch::optim optimizer steps the tensors it was built over, so it is built over
// ZeroParameters::tensors(): every local parameter that is not sharded as itself, and one tensor
// per owned piece of a sharded one (a leaf that shares the parameter's storage, so stepping it
// updates the parameter; pieces this rank owns nothing of are left out). step(optimizer) points
// each piece's gradient at its part of the parameter's gradient, steps, and all-gathers; the
// optimizer state then covers 1/R of a sharded stage's elements. Like parameters(), the pieces
// belong to one training deployment: rebuild them and the optimizer when trainingSelection()
// changes. (The Python API does the same inside its optimizer wrapper,
// bindings/python/autostage/optimizer.py.)

#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::optim {
class Optimizer;
}

namespace autostage {
namespace driver {
class Module;
}

class ZeroParameters {
 public:
  // The pieces of `module`'s training deployment (after a training call; collective-free).
  explicit ZeroParameters(driver::Module& module);
  // What the optimizer steps: whole unsharded parameters and the owned pieces of sharded ones.
  const std::vector<at::Tensor>& tensors() const { return tensors_; }
  // Gradients into the pieces, optimizer.step(), then the all-gather. Collective over the world.
  void step(torch::optim::Optimizer& optimizer);
  // The training deployment the pieces were made for (driver::Module::trainingSelection()).
  int selection() const { return selection_; }

 private:
  struct Piece {
    at::Tensor shard;  // the optimizer's tensor: elements [offset, offset + length) of param
    at::Tensor param;
    int64_t offset = 0, length = 0;
  };
  driver::Module& module_;
  int selection_ = 0;
  std::vector<Piece> pieces_;
  std::vector<at::Tensor> tensors_;
};

}  // namespace autostage
