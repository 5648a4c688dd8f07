"""Run under mpirun (see test_precision.py): precision="bf16" against plain PyTorch under
torch.autocast("cpu", dtype=torch.bfloat16) on the same data and the same micro-batches.

Every stage runs on one rank (partition_num = ranks), so each stage sees exactly the micro-batches
of Note [Sample ranges] (rows [B·m/M, B·(m+1)/M)); the reference runs each of those micro-batches
in its own autocast region, as the stages do, and takes one mean loss over the global batch, as
the ranks' local losses do together. Checked on every rank, for 3 Adam steps: output dtypes equal
plain autocast's, outputs close; this rank's parameters stay fp32, their gradients are fp32 and
close; parameters after each step close. On 4 ranks also with ZeRO-1 (2 stages x 2 replicas,
zero=1): gradients compared on the pieces each replica owns, parameters (all-gathered) whole.
On 2 ranks precision="fp16" too, against torch.autocast("cpu", dtype=torch.float16), where the
build runs it (LibTorch 2.5 or later, Note [fp16 on the CPU]; the tolerances below, made for
bf16's 8-bit significand, hold for fp16's 11 bits); elsewhere (LibTorch 1.13) it must raise
UnsupportedError on every rank.

Tolerances (bf16 has an 8-bit significand: one rounding step is 2^-8 ≈ 0.4% relative): both sides
run the same ops on the same bf16 values in the same micro-batches, so differences come only from
fp32 summation order (gradient accumulation over micro-batches) and from a bf16 rounding that
such a last-bit difference may flip (the MLP agrees bit for bit; in the encoder a few elements
differ by one or two bf16 steps, presumably because its stages receive contiguous copies where
plain PyTorch keeps strided views, so the GEMMs sum in another order). A flipped bf16 value upstream moves an output by a few steps, so outputs and
gradients: rtol 2e-2 (2.5 bf16 steps where a step is largest, 2^-7 relative), atol 4e-3 (one
step of a value in [0.5, 1)); measured: at most 2 steps.
Parameters after Adam steps of lr 1e-3: rtol 1e-3, atol 2e-4 (a fifth of one step), except for
elements whose plain-autocast gradient was within the gradient tolerance of zero (|g| <= 4e-3) at
some step: those may be off by up to 2 lr per step taken. Adam's first steps are about
lr * sign(gradient), so a gradient at bf16 noise level that rounds the other way moves its element
the other way, by 2 lr (seen in the encoder's LayerNorm and attention weights). The gradients
themselves are checked at every step above.
"""
import os
import sys

import torch
import torch.nn.functional as F

import autostage
from autostage import _autostage
from mpi_launch import finish

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "equivalence"))
from models import MODELS  # noqa: E402
from device_under_test import host

LOCAL, STEPS, LR = 8, 3, 1e-3
OUT_RTOL, OUT_ATOL, PARAM_RTOL, PARAM_ATOL = 2e-2, 4e-3, 1e-3, 2e-4


def micro_rows(global_batch, micros):
    return [slice(global_batch * m // micros, global_batch * (m + 1) // micros)
            for m in range(micros)]


class WithLoss(torch.nn.Module):
    """The model with the loop's loss inside, for train_step (1F1B runs only there)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return F.mse_loss(self.model(x).float(), y)


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def reference_step(model, x, y, micros, precision):
    """Plain PyTorch: each micro-batch's forward in its own autocast region, one mean loss."""
    outs = []
    for rows in micro_rows(x.shape[0], micros):
        with torch.autocast("cpu", dtype=DTYPES[precision]):
            outs.append(model(x[rows]))
    out = torch.cat(outs)
    F.mse_loss(out.float(), y).backward()
    return out.detach()


def close(what, got, expected, rtol, atol, failures, errors):
    if got.dtype != expected.dtype:
        failures.append(f"{what}: dtype {got.dtype}, plain autocast gives {expected.dtype}")
        return
    error = (got.double() - expected.double()).abs().max().item()
    errors[what.split()[0]] = max(errors.get(what.split()[0], 0.0), error)
    if not torch.allclose(host(got).double(), host(expected).double(), rtol=rtol, atol=atol):
        failures.append(f"{what}: max error {error:.3g}")


def close_params(what, got, expected, steps, noisy, failures, errors):
    """Parameters within rtol/atol, except elements in `noisy` (a reference gradient near zero at
    some step): those within 2 lr per step (see the module docstring)."""
    error = (got.double() - expected.double()).abs()
    errors["param"] = max(errors.get("param", 0.0), error.max().item())
    off = ~torch.isclose(got.double(), expected.double(), rtol=PARAM_RTOL, atol=PARAM_ATOL)
    errors["params_off"] = errors.get("params_off", 0) + int(off.sum())
    unexplained = off & ~noisy
    if unexplained.any() or error.max().item() > 2 * LR * steps * 1.01:
        failures.append(f"{what}: {int(off.sum())} of {off.numel()} elements off "
                        f"({int(unexplained.sum())} with a clear gradient), max error "
                        f"{error.max().item():.3g}")


def owned_mask(wrapped, param):
    """ZeRO-1: the elements of `param` whose gradient this rank owns (all without ZeRO-1)."""
    pieces = [(o, n) for _, p, o, n in wrapped._shards.values() if p.data_ptr() == param.data_ptr()]
    if not wrapped._shards:
        return torch.ones_like(param, dtype=torch.bool)
    mask = torch.zeros(param.numel(), dtype=torch.bool)
    for offset, length in pieces:
        mask[offset:offset + length] = True
    return mask.reshape(param.shape)


def run(name, micros, schedule, recompute, rank, world, failures, zero=False, precision="bf16"):
    spec = MODELS[name]
    model, reference = spec.build(), spec.build()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=LR)
    # 1F1B runs through train_step (Note [Plan usage]): the loss goes inside the model.
    train_step = schedule == "1f1b"
    # ZeRO-1: 2 stages of world / 2 replicas, optimizer state sharded over them (issue 19).
    stages = world // 2 if zero else world
    # With ZeRO-1 the stages must be replicated. The DP planner replicates a stage only where its
    # measured times say a second replica is faster, and this model's microseconds of compute
    # measure flat on a loaded machine: two CI runs planned one rank per stage and left two idle,
    # the second with communication made free. The uniform planner fixes the shape (every stage
    # world / stages replicas), so the case tests ZeRO-1 whatever the load.
    planner = dict(decomposer="uniform") if zero else {}
    wrapped = autostage.Module(WithLoss(model) if train_step else model, optimizer,
                               precision=precision, partition_num=stages, pipeline_num=micros,
                               schedule=schedule, recompute=recompute, zero=1 if zero else 0,
                               virtual_stages=1, **planner)
    rows = slice(rank * LOCAL, (rank + 1) * LOCAL)
    errors, noisy = {}, {}
    tag = f"{name} {schedule} recompute={recompute}{' zero=1' if zero else ''}"
    if precision != "bf16":
        tag += f" {precision}"
    for step in range(STEPS):
        (x,), y = spec.batch(world * LOCAL, step)
        optimizer.zero_grad()
        ref_opt.zero_grad()
        if train_step:
            out = wrapped.train_step(x[rows], y[rows])
            ref_out = reference_step(reference, x, y, micros, precision)
            expected = F.mse_loss(ref_out.float(), y)  # the global loss train_step returns
        else:
            out = wrapped(x[rows])
            F.mse_loss(out.float(), y[rows]).backward()
            expected = reference_step(reference, x, y, micros, precision)[rows]
        close(f"output step {step} ({tag})", out.detach(), expected, OUT_RTOL, OUT_ATOL,
              failures, errors)
        ref_params = dict(reference.named_parameters())
        local = {p.data_ptr() for p in wrapped.local_parameters()}
        for pname, p in model.named_parameters():
            if p.data_ptr() not in local:
                continue
            if p.dtype != torch.float32 or p.grad is None or p.grad.dtype != torch.float32:
                failures.append(f"{tag} step {step}: {pname} is {p.dtype} with gradient "
                                f"{None if p.grad is None else p.grad.dtype}; expected fp32 both")
                continue
            mine = owned_mask(wrapped, p)  # ZeRO-1 zeroes the pieces other replicas own
            if mine.any():
                close(f"grad step {step} {pname} ({tag})", p.grad[mine],
                      ref_params[pname].grad[host(mine)], OUT_RTOL, OUT_ATOL, failures, errors)
            near_zero = ref_params[pname].grad.abs() <= OUT_ATOL
            noisy[pname] = noisy[pname] | near_zero if pname in noisy else near_zero
        optimizer.step()
        ref_opt.step()
        for pname, p in model.named_parameters():
            if p.data_ptr() in local:
                close_params(f"param step {step} {pname} ({tag})", p.detach(),
                             ref_params[pname].detach(), step + 1,
                             noisy.get(pname, torch.zeros_like(p, dtype=torch.bool)), failures,
                             errors)
    info = wrapped._impl.deployment_info()
    if len(info["stages"]) != stages or info["micro_batches"] != micros:
        failures.append(f"{tag}: planned {len(info['stages'])} stages x {info['micro_batches']} "
                        f"micro-batches, forced {stages} x {micros}")
    # zero=1 shards every replicated stage; the uniform planner gives each world / stages ranks.
    if zero and not all(len(s["ranks"]) == world // stages and s["zero"] for s in info["stages"]):
        failures.append(f"{tag}: replicated stages without ZeRO-1: {info['stages']}")
    print(f"rank {rank}: {tag} output dtype {out.dtype}; max errors "
          + ", ".join(f"{k} {v:.3g}" for k, v in sorted(errors.items())) + "\n", end="",
          flush=True)


def check_fp16_refused(rank, failures):
    spec = MODELS["mlp"]
    # device=cpu: on a GPU (scripts/test-gpu runs this with AUTOSTAGE_DEVICE=cuda) fp16 is fine.
    wrapped = autostage.Module(spec.build(), None, precision="fp16", partition_num=1,
                               device="cpu")
    (x,), _ = spec.batch(LOCAL, 0)
    try:
        wrapped(x)
        failures.append("precision=fp16 on the CPU backend did not raise")
    except autostage.UnsupportedError as e:
        if "bf16" not in str(e) or "fp16" not in str(e):
            failures.append(f"fp16 error does not say what to do: {e}")
        print(f"rank {rank}: fp16 refused: {str(e).splitlines()[0]}", flush=True)


def main():
    torch.set_num_threads(1)
    rank, world = autostage.get_rank(), autostage.get_world_size()
    failures = []
    if world == 2:
        run("mlp", 2, "gpipe", "never", rank, world, failures)
        run("encoder", 2, "1f1b", "always", rank, world, failures)
        if _autostage._cpu_fp16_autocast():  # Note [fp16 on the CPU]: LibTorch 2.5 or later
            run("mlp", 2, "gpipe", "never", rank, world, failures, precision="fp16")
            run("encoder", 2, "1f1b", "always", rank, world, failures, precision="fp16")
        else:
            check_fp16_refused(rank, failures)
    else:
        run("mlp", 4, "1f1b", "always", rank, world, failures)
        run("encoder", 2, "gpipe", "never", rank, world, failures)
        run("mlp", 2, "1f1b", "never", rank, world, failures, zero=True)
    print(f"rank {rank}: precision checked; {len(failures)} failures", flush=True)
    finish(rank, failures)


if __name__ == "__main__":
    main()
