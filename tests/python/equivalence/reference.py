"""The single-process plain-PyTorch run each equivalence config is compared against.

Note [BatchNorm reference]
In training mode BatchNorm's result depends on which samples share a forward. autostage runs
every stage replica on its piece of each micro-batch: micro-batch m is rows [B*m/M, B*(m+1)/M)
of the global batch B, and replica i of R holds the i-th of R near-equal contiguous parts of it
(staging/sample_range.h). So each (micro-batch, replica) piece is normalised with its own batch
statistics — what DDP does per rank, and per micro-batch in a pipeline. The reference runs the
same model on the whole global batch with every BatchNorm layer patched to normalise each piece
separately (same weight and bias), which gives the same outputs and gradients.
Running statistics (autostage's definition, README "Runtime"): each replica updates its buffers
in place once per micro-batch piece it runs (momentum update with the piece's mean and unbiased
variance, in micro-batch order), and at the end of backward the floating-point buffers are
averaged over the stage's replicas. Because the momentum update is linear, that equals one
update per micro-batch with the replica-averaged piece statistics, which is what the patched
layers below do; num_batches_tracked grows by M per step on every replica.
"""
import torch
import torch.nn.functional as F


def pieces(global_batch, micro_batches, replicas):
    """[[(begin, end) per replica] per micro-batch], as staging::BatchLayout cuts them."""
    out = []
    for m in range(micro_batches):
        lo, hi = global_batch * m // micro_batches, global_batch * (m + 1) // micro_batches
        n = hi - lo
        out.append([(lo + n * i // replicas, lo + n * (i + 1) // replicas)
                    for i in range(replicas)])
    return out


def piecewise_batchnorm(bn, layout):
    """Replaces bn.forward (training mode) by the per-piece rule of Note [BatchNorm reference]."""
    def forward(x):
        dims = [0] + list(range(2, x.dim()))
        outputs = []
        for parts in layout:
            means, variances = [], []
            for begin, end in parts:
                piece = x[begin:end]
                outputs.append(F.batch_norm(piece, None, None, bn.weight, bn.bias, True, 0.0,
                                            bn.eps))
                means.append(piece.detach().mean(dims))
                variances.append(piece.detach().var(dims, unbiased=True))
            with torch.no_grad():
                bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * torch.stack(means).mean(0))
                bn.running_var.mul_(1 - bn.momentum).add_(
                    bn.momentum * torch.stack(variances).mean(0))
                bn.num_batches_tracked.add_(1)
        return torch.cat(outputs)
    bn.forward = forward


class ReferenceRun:
    def __init__(self, spec, lr):
        self.spec = spec
        self.model = spec.build()
        self.model.train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.params = dict(self.model.named_parameters())

    def split_batchnorm(self, info, global_batch):
        if not self.spec.has_batchnorm:
            return
        replicas = {len(s["ranks"]) for s in info["stages"]}
        if len(replicas) != 1:
            raise RuntimeError(f"the reference needs one replica count for every stage, the plan "
                               f"has {sorted(replicas)}")
        layout = pieces(global_batch, info["micro_batches"], replicas.pop())
        for module in self.model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                piecewise_batchnorm(module, layout)

    def step_forward_backward(self, inputs, target):
        self.optimizer.zero_grad()
        out = self.model(*inputs)
        (out if self.spec.returns_loss else self.spec.loss(out, target)).backward()
        return out.detach()

    def optimizer_step(self):
        self.optimizer.step()

    def grad(self, name):
        grad = self.params[name].grad
        return grad if grad is not None else torch.zeros_like(self.params[name])

    def tensor(self, name):
        return self.model.state_dict(keep_vars=True)[name]
