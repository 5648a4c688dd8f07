// Note [ZeRO-1 in the C++ API] in zero_optimizer.h.
#include "bindings/cpp/zero_optimizer.h"

#include <set>

#include <torch/optim/optimizer.h>

#include "core/error.h"
#include "driver/module.h"

namespace autostage {

ZeroParameters::ZeroParameters(driver::Module& module)
    : module_(module), selection_(module.trainingSelection()) {
  AUTOSTAGE_CHECK(selection_ > 0, "ZeRO-1 pieces exist once a training deployment does: make "
                  "the first training call (forward with gradients, or trainStep) first");
  const staging::Executor& executor = module.trainingExecutor();
  std::set<const void*> sharded;
  for (const staging::ShardPiece& piece : executor.zeroShards()) {
    at::Tensor param = executor.params().tensor(piece.param);
    sharded.insert(param.unsafeGetTensorImpl());
    if (piece.length == 0) continue;  // sharded, but another replica owns all of it
    AUTOSTAGE_CHECK(param.is_contiguous(), "ZeRO-1 needs contiguous parameters; parameter ",
                    piece.param, " is not");
    at::Tensor shard = param.detach().view(-1).narrow(0, piece.offset, piece.length).detach();
    shard.set_requires_grad(true);
    pieces_.push_back({shard, param, piece.offset, piece.length});
    tensors_.push_back(shard);
  }
  for (const at::Tensor& p : module.parameters())
    if (!sharded.count(p.unsafeGetTensorImpl())) tensors_.push_back(p);
}

void ZeroParameters::step(torch::optim::Optimizer& optimizer) {
  AUTOSTAGE_CHECK(module_.trainingSelection() == selection_, "the training deployment changed "
                  "since these ZeRO-1 pieces were made; make ZeroParameters and the optimizer "
                  "again");
  for (Piece& piece : pieces_) {
    const at::Tensor& grad = piece.param.grad();
    piece.shard.mutable_grad() =
        grad.defined() ? grad.view(-1).narrow(0, piece.offset, piece.length) : at::Tensor();
  }
  optimizer.step();
  module_.trainingExecutor().gatherParams();
}

}  // namespace autostage
