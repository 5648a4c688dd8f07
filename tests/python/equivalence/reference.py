"""The single-process plain-PyTorch run each equivalence config is compared against.

Note [BatchNorm reference]
In training mode BatchNorm's result depends on which samples share a forward. autostage runs
every stage replica on its piece of each micro-batch: micro-batch m is rows [B*m/M, B*(m+1)/M)
of the global batch B, and replica i of R holds the i-th of R near-equal contiguous parts of it
(staging/sample_range.h). So each (micro-batch, replica) piece is normalised with its own batch
statistics — what DDP does per rank, and per micro-batch in a pipeline. The reference runs the
same model on each piece in turn (the piece shapes the replicas run, so the same kernels), with
its BatchNorm layers normalising with the piece's statistics, concatenates the outputs and
applies the loss to the whole global batch: the same outputs and gradients.
Running statistics (autostage's definition, docs/runtime.md): each replica updates its buffers
in place once per micro-batch piece it runs (momentum update with the piece's mean and unbiased
variance, in micro-batch order), and at the end of backward the floating-point buffers are
averaged over the stage's replicas. Because the momentum update is linear, that equals one
update per micro-batch with the replica-averaged piece statistics, which is what the patched
layers below do (this needs one replica count for every stage); num_batches_tracked grows by M per step on every replica.
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


def record_batchnorm(bn):
    """bn.forward normalises with the batch's own statistics and records them; update_running()
    applies the recorded pieces' average as one momentum update (Note [BatchNorm reference])."""
    bn.pending = []

    def forward(x):
        dims = [0] + list(range(2, x.dim()))
        bn.pending.append((x.detach().mean(dims), x.detach().var(dims, unbiased=True)))
        return F.batch_norm(x, None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
    bn.forward = forward


def update_running(bn):
    with torch.no_grad():
        mean = torch.stack([m for m, _ in bn.pending]).mean(0)
        var = torch.stack([v for _, v in bn.pending]).mean(0)
        bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean)
        bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * var)
        bn.num_batches_tracked.add_(1)
    bn.pending = []


class ReferenceRun:
    def __init__(self, spec, lr):
        self.spec = spec
        self.model = spec.build()
        self.model.train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.params = dict(self.model.named_parameters())

    def split_batchnorm(self, info, global_batch):
        self.layout = None
        if not self.spec.has_batchnorm:
            return
        replicas = {len(s["ranks"]) for s in info["stages"]}
        if len(replicas) != 1:
            raise RuntimeError(f"the reference needs one replica count for every stage, the plan "
                               f"has {sorted(replicas)}")
        self.layout = pieces(global_batch, info["micro_batches"], replicas.pop())
        self.batchnorms = [m for m in self.model.modules()
                           if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        for bn in self.batchnorms:
            record_batchnorm(bn)

    def _forward(self, inputs):
        if self.layout is None:
            return self.model(*inputs)
        outputs, total = [], inputs[0].shape[0]
        for parts in self.layout:
            for begin, end in parts:  # the same piece shapes the stage replicas run
                out = self.model(*(t[begin:end] for t in inputs))
                # A mean loss per piece weighs in by its rows (Note [Loss outputs]).
                outputs.append(out * ((end - begin) / total) if self.spec.returns_loss else out)
            for bn in self.batchnorms:
                update_running(bn)
        return torch.stack(outputs).sum(0) if self.spec.returns_loss else torch.cat(outputs)

    def step_forward_backward(self, inputs, target):
        self.optimizer.zero_grad()
        out = self._forward(inputs)
        (out if self.spec.returns_loss else self.spec.loss(out, target)).backward()
        return out.detach()

    def optimizer_step(self):
        self.optimizer.step()

    def grad(self, name):
        grad = self.params[name].grad
        return grad if grad is not None else torch.zeros_like(self.params[name])

    def tensor(self, name):
        return self.model.state_dict(keep_vars=True)[name]
