"""Run under mpirun on 4 ranks (see test_modes.py): a model with Dropout and BatchNorm, trained
with Adam, switched between train and eval mode, against plain single-process PyTorch."""
import copy

import torch

import autostage
from mpi_launch import finish
from device_under_test import allclose

LOCAL, LR = 4, 0.01


class Net(torch.nn.Module):
    """Dropout(p=1) zeroes the aux branch in train mode only (deterministically, so the plain
    reference sees the same); BatchNorm normalises with batch statistics in train mode and with
    its running statistics in eval mode."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.inp = torch.nn.Linear(6, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 16), torch.nn.Tanh())
        self.aux = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(p=1.0)
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x):
        h = torch.tanh(self.bn(self.inp(x)))
        return self.out(self.body(h) + self.drop(self.aux(h)))


def batch(step, rows):
    g = torch.Generator().manual_seed(700 + step)
    return torch.randn(rows, 6, generator=g), torch.randn(rows, 3, generator=g)


def compare_state(wrapped, reference, what, failures):
    state, ref = wrapped.state_dict(), reference.state_dict()
    for key, value in ref.items():
        if key.endswith("num_batches_tracked"):
            continue  # not advanced by the runtime (docs/runtime.md, BatchNorm)
        if not allclose(state[key], value, rtol=1e-5, atol=1e-6):
            failures.append(f"{what}: {key} differs by {(state[key] - value).abs().max()}")


def main():
    rank, world = autostage.get_rank(), autostage.get_world_size()
    rows = slice(rank * LOCAL, (rank + 1) * LOCAL)
    failures = []
    model, reference = Net(), Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=LR)
    # Train mode: one stage per rank and one micro-batch, so the BatchNorm stage sees the whole
    # batch, as the plain reference does.
    wrapped = autostage.Module(model, optimizer, partition_num=4, pipeline_num=1,
                               schedule="gpipe", recompute="never")

    def step(number):
        x, y = batch(number, world * LOCAL)
        for net, opt, xs, ys in ((wrapped, optimizer, x[rows], y[rows]),
                                 (reference, ref_optimizer, x, y)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(xs), ys).backward()
            opt.step()

    for number in range(2):
        step(number)
    compare_state(wrapped, reference, "after 2 train steps", failures)

    # Eval mode gets its own plan: force a different one (2 stages; free communication makes
    # replicas pay off), so ranks hold other parameters than in train mode.
    for key, value in (("partition_num", "2"), ("comm_latency", "0"),
                       ("comm_bandwidth", "1e15"), ("allreduce_bandwidth", "1e15")):
        autostage._autostage._set_option(key, value)
    x, _ = batch(10, world * LOCAL)
    trained = copy.deepcopy(reference)(x)[rows].detach()  # train-mode output, for contrast
    wrapped.eval()
    reference.eval()
    with torch.no_grad():
        out = wrapped(x[rows])
        expected = reference(x)[rows]
    if out.requires_grad or out.grad_fn is not None:
        failures.append("a forward under torch.no_grad() returned a tensor with autograd history")
    if not allclose(out, expected, rtol=1e-5, atol=1e-6):
        failures.append(f"eval output differs from plain eval by {(out - expected).abs().max()}")
    if allclose(out, trained, rtol=1e-3, atol=1e-3):
        failures.append("eval output equals the train-mode output: the modes do not differ")

    # A training step in eval mode: the optimizer follows the eval deployment's parameters.
    step(2)
    compare_state(wrapped, reference, "after a step in eval mode", failures)

    wrapped.train()
    reference.train()
    step(3)
    compare_state(wrapped, reference, "after switching back to train and 1 more step", failures)
    x, _ = batch(11, world * LOCAL)
    out = wrapped(x[rows]).detach()
    expected = reference(x)[rows].detach()  # both update their BatchNorm running statistics
    if not allclose(out, expected, rtol=1e-5, atol=1e-6):
        failures.append(f"train output differs from plain by {(out - expected).abs().max()}")
    # Dropping both deployments (what autostage.rannc's undeploy/enable_dropout build on): the
    # next call traces and plans again (here in eval mode, 2 stages: ranks hold parameters they
    # did not hold in the 4-stage train plan), and parameters, buffers and Adam state carry over.
    wrapped._undeploy()
    wrapped.eval()
    reference.eval()
    step(4)
    compare_state(wrapped, reference, "after undeploying and 1 more step", failures)
    print(f"rank {rank}: modes checked; {len(failures)} failures", flush=True)
    finish(rank, failures)


if __name__ == "__main__":
    main()
