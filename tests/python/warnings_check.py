"""Run under mpirun on 2 ranks (see test_warnings.py): the calls a training script makes on an
autostage.Module -- forward/backward with an optimizer, train_step, bf16 autocast stages,
evaluation under no_grad, clip_grad_norm, state_dict -- with every DeprecationWarning and
FutureWarning raised as an error and every other warning recorded. A rank prints each warning it
saw (`rank R: WARNING <category>: <message>`) and `rank R: calls done`; the test decides which
are autostage's own."""
import sys
import warnings

import torch

import autostage
from mpi_launch import finish

LOCAL = 8


class LossNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 16))

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.net(x), y)


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(LOCAL, 16, generator=g), torch.randn(LOCAL, 16, generator=g)


def calls(precision):
    model = LossNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    wrapped = autostage.Module(model, optimizer, partition_num=2, precision=precision)
    for step in range(2):
        x, y = batch(step)
        wrapped(x, y).backward()
        wrapped.clip_grad_norm(1.0)
        optimizer.step()
        optimizer.zero_grad()
    x, y = batch(2)
    wrapped.train_step(x, y)
    optimizer.step()
    wrapped.eval()
    with torch.no_grad():
        wrapped(x, y)
    wrapped.train()
    return wrapped.state_dict()


def main():
    rank = autostage.get_rank()
    failures = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.simplefilter("error", DeprecationWarning)
        warnings.simplefilter("error", FutureWarning)
        try:
            for precision in ("fp32", "bf16"):
                calls(precision)
        except (DeprecationWarning, FutureWarning) as e:
            failures.append(f"{type(e).__name__} raised: {e}")
    for w in seen:
        print(f"rank {rank}: WARNING {w.category.__name__}: {w.message} "
              f"({w.filename}:{w.lineno})", flush=True)
    print(f"rank {rank}: calls done", flush=True)
    finish(rank, failures)


if __name__ == "__main__":
    sys.exit(main())
