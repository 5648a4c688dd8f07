"""Run under mpirun (see test_loss_scale.py): autostage.GradScaler against plain single-process
PyTorch with the same rules written out here (rtol 1e-5). The scales are powers of two, so
unscaled gradients equal the plain ones exactly and Adam steps equal PyTorch's. Phases:

- `train_step`: a model returning its loss, 6 Adam steps of ``train_step`` (scaled inside).
- `backward`: ``scaler.scale(wrapped(x, y)).backward()``, ``unscale_``, global-norm clipping,
  ``step``.

A second argument `1` plans with ZeRO-1 (zero=1, one stage on replicas: the optimizer steps
shards).

At step 2 the last rank's rows hold an inf: the loss and every gradient become NaN, the reference
skips that step, and so must every rank (parameters unchanged, scale halved); growth_interval=2
doubles the scale after two finite steps. Each step compares the loss, the scale, the parameters
and the optimizer's global state with the reference.
"""
import math
import sys

import torch

import autostage
from interleave_check import Net, compare_state  # the tied tanh stack returning its loss
from mpi_launch import finish
from device_under_test import host, equal

LOCAL, LR, STEPS, OVERFLOW_STEP, INIT_SCALE, INTERVAL = 4, 0.05, 6, 2, 2.0**10, 2
RTOL, ATOL = 1e-5, 1e-6


def batch(step, world):
    g = torch.Generator().manual_seed(900 + step)
    x, y = torch.randn(world * LOCAL, 6, generator=g), torch.randn(world * LOCAL, 6, generator=g)
    if step == OVERFLOW_STEP:
        x[world * LOCAL - 1, 0] = math.inf  # in the last rank's rows only
    return x, y


def close(a, b):
    return torch.allclose(host(a).double(), host(b).double(), rtol=RTOL, atol=ATOL,
                          equal_nan=True)


def main():
    phase = sys.argv[1]
    zero = sys.argv[2] if len(sys.argv) > 2 else "0"
    rank, world = autostage.get_rank(), autostage.get_world_size()
    failures = []
    model, reference = Net(depth=4, width=8, seed=17), Net(depth=4, width=8, seed=17)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=LR)
    # ZeRO-1: one stage whose optimizer state (counted 200 bytes per parameter byte) fits the
    # memory limit only split over 2 or more replicas, so the plan shards whatever the profile.
    layout = (dict(partition_num=1, opt_param_factor=200, mem_limit_gb=230e3 / 2**30,
                   mem_margin=0) if zero == "1" else dict(partition_num=2))
    wrapped = autostage.Module(model, optimizer, gradient_bucket_bytes=256, zero=zero, **layout)
    scaler = autostage.GradScaler(wrapped, init_scale=INIT_SCALE, growth_interval=INTERVAL)
    ref_scale, ref_tracker = INIT_SCALE, 0
    rows = slice(rank * LOCAL, (rank + 1) * LOCAL)
    skipped = 0
    for step in range(STEPS):
        x, y = batch(step, world)
        # The reference: plain PyTorch, GradScaler's rules written out.
        ref_loss = reference(x, y)
        ref_loss.backward()
        finite = all(torch.isfinite(p.grad).all() for p in reference.parameters())
        if phase == "backward" and finite:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        if finite:
            ref_opt.step()
            ref_tracker += 1
            if ref_tracker == INTERVAL:
                ref_scale, ref_tracker = ref_scale * 2, 0
        else:
            ref_scale, ref_tracker = ref_scale / 2, 0
        ref_opt.zero_grad()
        # autostage.
        if phase == "train_step":
            loss = wrapped.train_step(x[rows], y[rows])
        else:
            loss = wrapped(x[rows], y[rows])
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            norm = wrapped.clip_grad_norm(1.0)
            if math.isfinite(norm) != finite:
                failures.append(f"step {step}: norm {norm} after unscale_, plain finite={finite}")
        if not close(loss.detach(), ref_loss.detach()):
            failures.append(f"step {step}: loss {loss.item()} != plain {ref_loss.item()}")
        before = [p.detach().clone() for p in wrapped.local_parameters()]
        result = scaler.step(optimizer)
        if not finite:
            skipped += 1
            if result is not None or any(not equal(p, q) for p, q in
                                         zip(wrapped.local_parameters(), before)):
                failures.append(f"step {step}: the overflowed step was not skipped")
        scaler.update()
        optimizer.zero_grad()
        if scaler.get_scale() != ref_scale:
            failures.append(f"step {step}: scale {scaler.get_scale()} != {ref_scale}")
        if scaler.state_dict()["_growth_tracker"] != ref_tracker:
            failures.append(f"step {step}: growth tracker {scaler.state_dict()} != {ref_tracker}")
        held = {t.data_ptr() for t in wrapped.local_parameters()}
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            if p.data_ptr() in held and not close(p, q):
                failures.append(f"step {step}: parameter {name} differs after the step by "
                                f"{(p - q).abs().max().item():.3g} (max {q.abs().max().item():.3g})")
        compare_state(optimizer.state_dict(from_global=True), ref_opt.state_dict(), failures,
                      step)
    stages = wrapped._impl.deployment_info()["stages"]
    if zero == "1" and not any(s["zero"] for s in stages):
        failures.append(f"zero=1 on {world} ranks, but no stage is sharded: {stages}")
    if skipped != 1:
        failures.append(f"{skipped} steps were skipped, expected 1")
    # A saved state loads into a new scaler.
    again = autostage.GradScaler(wrapped)
    again.load_state_dict(scaler.state_dict())
    if again.get_scale() != scaler.get_scale() or again.state_dict() != scaler.state_dict():
        failures.append(f"load_state_dict: {again.state_dict()} != {scaler.state_dict()}")
    for line in failures[:20]:
        print(f"rank {rank}: {line}", flush=True)
    print(f"rank {rank}: loss scale {phase} checked (final scale {scaler.get_scale():g}); "
          f"{len(failures)} failures", flush=True)
    finish(rank, failures)


if __name__ == "__main__":
    main()
