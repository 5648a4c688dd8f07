"""Run under mpirun (see test_rannc.py): pyrannc's gather_inputs=False (the batch rank 0 passes,
also by keyword) and enable_dropout (switching dropout off and on after deployment), against plain PyTorch."""

import torch

from autostage import rannc as pyrannc
from mpi_launch import finish


def make(dropout, seed=3):
    torch.manual_seed(seed)
    layers = []
    for _ in range(3):
        layers += [torch.nn.Linear(12, 12), torch.nn.Tanh()]
        if dropout:
            layers.append(torch.nn.Dropout(0.5))
    return torch.nn.Sequential(*layers)


def data(seed, rows):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 12, generator=g), torch.randn(rows, 12, generator=g)


def close(a, b):
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def check_rank0_inputs(rank, world, failures):
    """gather_inputs=False: only rank 0's batch counts; every rank gets the whole output."""
    model, reference = make(False), make(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    model = pyrannc.RaNNCModule(model, optimizer, gather_inputs=False)
    criterion = torch.nn.MSELoss()
    for step in range(2):
        x, y = data(step, 4 * world)
        mine = x if rank == 0 else torch.zeros_like(x)  # other ranks' inputs are not used
        out = model(mine)
        if out.shape != y.shape or not close(out.detach(), reference(x).detach()):
            failures.append(f"gather_inputs=False step {step}: output differs from plain")
        criterion(out, y).backward()
        criterion(reference(x), y).backward()
        optimizer.step()
        ref_opt.step()
        model.zero_grad()
        ref_opt.zero_grad()
    for name, p in reference.named_parameters():
        if not close(model.get_param(name), p.detach()):
            failures.append(f"gather_inputs=False: parameter {name} differs from plain")


class Scaled(torch.nn.Module):
    """A tensor and a flag by keyword in, a dict out."""

    def __init__(self):
        super().__init__()
        self.body = make(False)

    def forward(self, x, scale=None, negate=False):
        y = self.body(x) * scale
        return {"y": -y if negate else y, "aux": None}


def check_rank0_keywords(rank, world, failures):
    """gather_inputs=False with keyword tensors: rank 0's `scale` rows count like its `x`."""
    torch.manual_seed(4)
    model, reference = Scaled(), Scaled()
    reference.load_state_dict(model.state_dict())
    model = pyrannc.RaNNCModule(model, gather_inputs=False)
    x, scale = data(7, 4 * world)
    mine = (x, scale) if rank == 0 else (torch.zeros_like(x), torch.zeros_like(scale))
    out = model(mine[0], scale=mine[1], negate=True)
    want = reference(x, scale=scale, negate=True)
    if list(out) != ["y", "aux"] or out["aux"] is not None or \
            not close(out["y"].detach(), want["y"].detach()):
        failures.append("gather_inputs=False with keywords: output differs from plain")


def check_enable_dropout(rank, world, failures):
    model, reference = make(True), make(True)
    reference.eval()  # dropout off
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    model = pyrannc.RaNNCModule(model, optimizer)
    rows = slice(rank * 4, (rank + 1) * 4)
    x, y = data(5, 4 * world)
    model.enable_dropout(False)
    out = model(x[rows])
    if not close(out.detach(), reference(x)[rows].detach()):
        failures.append("enable_dropout(False) before deployment: output differs from plain")
    torch.nn.functional.mse_loss(out, y[rows]).backward()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    optimizer.step()
    ref_opt.step()
    model.zero_grad()
    ref_opt.zero_grad()

    model.enable_dropout(True)  # re-traced and re-planned on the next call
    out = model(x[rows])
    zeros = int((out == 0).sum())
    out.sum().backward()
    model.zero_grad()
    if zeros == 0:
        failures.append("enable_dropout(True) after deployment: no element was dropped")

    model.enable_dropout(False)
    out = model(x[rows]).detach()
    if not close(out, reference(x)[rows].detach()):
        failures.append("enable_dropout(False) again: output differs from the trained plain model")


def main():
    rank, world = pyrannc.get_rank(), pyrannc.get_world_size()
    failures = []
    check_rank0_inputs(rank, world, failures)
    check_rank0_keywords(rank, world, failures)
    check_enable_dropout(rank, world, failures)
    print(f"rank {rank}: rannc extras checked; {len(failures)} failures", flush=True)
    finish(rank, failures)


if __name__ == "__main__":
    main()
