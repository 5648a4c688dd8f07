"""The plain-PyTorch run a zoo config is compared against: the same model, one process, the
global batch. Models with BatchNorm run each (micro-batch, replica) piece separately with the
piece's statistics (Note [BatchNorm reference] in tests/python/equivalence/reference.py, whose
helpers this reuses); outputs are joined leaf by leaf, a scalar (a loss inside the output)
weighted by the piece's rows (Note [Loss outputs] in staging/executor.h)."""
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python",
                                "equivalence"))
from reference import pieces, record_batchnorm, update_running  # noqa: E402


def leaves(value, path=""):
    """[(path, leaf)] of a nested output: tensors and constants, in order."""
    if isinstance(value, collections.abc.Mapping):
        return [x for k, v in value.items() for x in leaves(v, f"{path}[{k!r}]")]
    if isinstance(value, (tuple, list)):
        return [x for i, v in enumerate(value) for x in leaves(v, f"{path}[{i}]")]
    return [(path, value)]


def rebuild(like, values):
    """`like` with its leaves replaced by `values` (an iterator), same containers."""
    if isinstance(like, collections.abc.Mapping):
        return type(like)((k, rebuild(v, values)) for k, v in like.items())
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        return type(like)(*[rebuild(v, values) for v in like])
    if isinstance(like, (tuple, list)):
        return type(like)(rebuild(v, values) for v in like)
    return next(values)


def join(outputs, sizes):
    """One output from the pieces' outputs: batch tensors concatenated, scalars weighted."""
    total = sum(sizes)
    joined = []
    for parts in zip(*[[leaf for _, leaf in leaves(o)] for o in outputs]):
        first = parts[0]
        if not isinstance(first, torch.Tensor):
            joined.append(first)
        elif first.dim() == 0:
            joined.append(sum(p * (n / total) for p, n in zip(parts, sizes)))
        else:
            joined.append(torch.cat(parts))
    return rebuild(outputs[0], iter(joined))


class ZooReference:
    def __init__(self, entry, optimizer_for):
        self.entry = entry
        self.model = entry.model()
        self.optimizer = optimizer_for(self.model.parameters())
        self.params = dict(self.model.named_parameters())
        self.layout = None

    def split_batchnorm(self, info, global_batch):
        self.batchnorms = [m for m in self.model.modules()
                           if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        if not self.batchnorms:
            return
        replicas = {len(s["ranks"]) for s in info["stages"]}
        if len(replicas) != 1:
            raise RuntimeError(f"the BatchNorm reference needs one replica count for every "
                               f"stage; the plan has {sorted(replicas)}")
        self.layout = pieces(global_batch, info["micro_batches"], replicas.pop())
        for bn in self.batchnorms:
            record_batchnorm(bn)

    def _forward(self, args, kwargs):
        if self.layout is None:
            return self.model(*args, **kwargs)
        outputs, sizes = [], []
        for parts in self.layout:
            for begin, end in parts:
                outputs.append(self.model(*(a[begin:end] for a in args),
                                          **{k: v[begin:end] for k, v in kwargs.items()}))
                sizes.append(end - begin)
            for bn in self.batchnorms:
                update_running(bn)
        return join(outputs, sizes)

    def step(self, args, kwargs, target):
        self.optimizer.zero_grad()
        out = self._forward(args, kwargs)
        entry = self.entry
        loss = out[entry.loss_key] if entry.loss is None else entry.loss(out, target)
        loss.backward()
        return out

    def optimizer_step(self):
        self.optimizer.step()

    def grad(self, name):
        grad = self.params[name].grad
        return grad if grad is not None else torch.zeros_like(self.params[name])

    def tensor(self, name):
        tensors = dict(self.model.named_buffers())  # non-persistent ones too
        tensors.update(self.model.state_dict(keep_vars=True))
        return tensors[name]
