"""Run under mpirun (see test_traced_code.py): models whose captured graph computes sizes from
traced ints (products in a loop, numel, floordiv, -1 views) or runs scripted loops and branches
without outputs, trained on 1-4 stages (uniform cuts, so the stage boundaries fall before, inside
and after that code) and compared with plain single-process PyTorch in float64.

    traced_code_check.py FRONT_END...     (auto, torchscript, export)
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import autostage
from mpi_launch import finish


class FlattenByLoop(nn.Module):
    """RaNNC's BasicModel: the flattened size is a product of sizes taken in a Python loop (traced
    as in-place multiplications of tensors made from ints)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 6, 3)
        self.fc1 = nn.Linear(6 * 2 * 2, 16)
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        features = 1
        for size in x.size()[1:]:
            features *= size
        x = x.view(-1, features)
        return self.fc2(F.relu(self.fc1(x)))

    OUT = 5

    @staticmethod
    def batch(rows, g):
        return torch.randn(rows, 1, 14, 14, generator=g, dtype=torch.float64)


class SizeArithmetic(nn.Module):
    """numel // size(0), heads from floordiv and a product, a -1 view, and a size used as a
    value: each feeds the next layer across possible stage boundaries."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 12)
        self.mid = nn.Linear(12, 12)
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        b, t, c = x.size()
        h = torch.tanh(self.inp(x))
        flat = h.reshape(b, h.numel() // b)                      # numel // size(0)
        heads = 2
        h = flat.view(b, t, heads, c // heads).transpose(1, 2)  # floordiv
        h = h.reshape(b, heads * t, c // heads)
        h = h.reshape(-1, t, c)                                  # -1 view
        h = torch.tanh(self.mid(h)) * (t * c) / (c * t)          # sizes as numbers
        scale = h.size(1) * h.size(2) // (2 * h.size(1))         # c // 2
        return self.out(h[:, :, :scale * 2]).mean(dim=1)

    OUT = 3

    @staticmethod
    def batch(rows, g):
        return torch.randn(rows, 5, 12, generator=g, dtype=torch.float64)


@torch.jit.script
def zero_even_tokens(x):
    for row in x:
        for i in range(0, row.numel()):
            if row[i] % 2 == 0:
                row[i] = 0
    return x


@torch.jit.script
def check_not_empty(x):
    if x.size(0) == 0:  # a branch without outputs whose block only raises
        raise ValueError("empty batch")
    return x


class ScriptedLoops(nn.Module):
    """A scripted function with nested loops and a branch that return nothing (they write into
    the token ids), one whose branch only raises, then layers over the result."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.fc = nn.Linear(6, 6)
        self.out = nn.Linear(6, 2)

    def forward(self, ids):
        ids = zero_even_tokens(check_not_empty(ids))
        h = torch.tanh(self.fc(self.emb(ids)))
        return self.out(h).sum(dim=1)

    OUT = 2

    @staticmethod
    def batch(rows, g):
        return torch.randint(10, (rows, 7), generator=g)


def check(model_cls, front_end, stages, world, rank, failures):
    local = 4
    g = torch.Generator().manual_seed(7)
    torch.manual_seed(11)
    reference = model_cls().double()
    model = model_cls().double()
    model.load_state_dict(reference.state_dict())
    wrapped = autostage.Module(model, front_end=front_end, decomposer="uniform",
                               partition_num=stages, pipeline_num=1, recompute="never")
    what = f"{model_cls.__name__} front_end={front_end} stages={stages}"
    for step in range(2):
        x = model_cls.batch(world * local, g)
        y = torch.randn(world * local, model_cls.OUT, generator=g, dtype=torch.float64)
        rows = slice(rank * local, (rank + 1) * local)
        out = wrapped(x[rows].clone())
        expected = reference(x.clone())
        if out.shape != expected[rows].shape or not torch.allclose(out, expected[rows],
                                                                   rtol=1e-9, atol=1e-12):
            failures.append(f"{what} step {step}: output differs from plain PyTorch")
            return
        F.mse_loss(out, y[rows]).backward()
        F.mse_loss(expected, y).backward()
        local_ptrs = {p.data_ptr() for p in wrapped.local_parameters()}
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            if p.data_ptr() in local_ptrs and not torch.allclose(p.grad, q.grad, rtol=1e-9,
                                                                  atol=1e-12):
                failures.append(f"{what} step {step}: gradient of {name} differs")
        for p in list(model.parameters()) + list(reference.parameters()):
            p.grad = None
    if stages > 1 and len(wrapped._impl.deployment_info()["stages"]) != stages:
        failures.append(f"{what}: the plan does not have {stages} stages")


def main():
    rank, world = autostage.get_rank(), autostage.get_world_size()
    failures = []
    for front_end in sys.argv[1:]:
        for model_cls in (FlattenByLoop, SizeArithmetic, ScriptedLoops):
            if front_end == "export" and model_cls is ScriptedLoops:
                continue  # scripted code is TorchScript's (Note [Front ends])
            for stages in range(1, world + 1):
                check(model_cls, front_end, stages, world, rank, failures)
    print(f"rank {rank}: traced code checked; {len(failures)} failures", flush=True)
    finish(rank, failures)


if __name__ == "__main__":
    main()
