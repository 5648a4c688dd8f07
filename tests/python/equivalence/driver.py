"""Equivalence matrix: autostage.Module under mpirun vs the same model trained in one process.

Run: mpirun -np N python driver.py CACHE_DIR  (N in 1, 2, 4; test_equivalence.py does it). Runs
every CONFIGS row whose rank count is N, each with a fresh model, a fresh autostage.Module and
every option set explicitly (options are global). Each config trains 3 Adam steps and compares,
on every rank, the outputs of its local batch (or the global loss), every local parameter's
gradient before each step, every local parameter after each step and, at the end, every local
buffer (BatchNorm running statistics) against plain PyTorch on the global batch, within
rtol 1e-5 / atol 1e-6. Prints one line per config and rank: `ok` or `FAIL` with the largest
error and what differed.

Reference (Note [BatchNorm reference] in reference.py): models without BatchNorm are compared
with the single-process full-batch run; BatchNorm models with the same model whose BatchNorm
layers normalise each (micro-batch, replica) piece of the global batch separately.
"""
import os
import sys
import traceback

import torch

import autostage
from models import MODELS, with_loss
from reference import ReferenceRun

RTOL, ATOL, STEPS, LOCAL_BATCH, LR = 1e-5, 1e-6, 3, 8, 1e-3
VERBOSE = bool(os.environ.get("AUTOSTAGE_EQUIV_VERBOSE"))


def say(line):
    sys.stdout.write(line + "\n")  # one write per line: ranks share the terminal
    sys.stdout.flush()

# Covering design (checked by test_equivalence.py::test_matrix_is_a_covering_design): every
# model on every rank count; per model every partition_num (1 on 1 rank, 2 on 2, 4 on 4), both
# pipeline_num values, both schedules and both recompute values; over the table every pair of
# values of two different options. `call` is how a step runs: forward+backward or train_step
# (the model with its loss inside, models.with_loss). forward+backward can run gpipe only (Note
# [Plan usage] in core/plan_usage.h), so every 1f1b row calls train_step.
#  model       ranks partition pipeline schedule recompute call
CONFIGS = [
    ("mlp",       1, 1, 4, "gpipe", "never",  "forward"),
    ("mlp",       2, 2, 1, "1f1b",  "always", "train_step"),
    ("mlp",       4, 4, 4, "1f1b",  "never",  "train_step"),
    ("mlp",       4, 2, 1, "gpipe", "always", "forward"),
    ("cnn_bn",    1, 1, 1, "1f1b",  "always", "train_step"),
    ("cnn_bn",    2, 2, 4, "gpipe", "never",  "forward"),
    ("cnn_bn",    4, 4, 4, "gpipe", "always", "forward"),
    ("cnn_bn",    4, 1, 4, "1f1b",  "never",  "train_step"),  # 4 replicas: buffers averaged
    ("encoder",   1, 1, 4, "1f1b",  "never",  "train_step"),
    ("encoder",   2, 2, 1, "gpipe", "always", "forward"),
    ("encoder",   4, 4, 4, "1f1b",  "always", "train_step"),
    ("resnet18",  1, 1, 1, "gpipe", "always", "forward"),
    ("resnet18",  2, 2, 4, "1f1b",  "never",  "train_step"),
    ("resnet18",  4, 4, 1, "1f1b",  "always", "train_step"),
    ("tied",      1, 1, 1, "gpipe", "never",  "forward"),
    ("tied",      2, 2, 4, "1f1b",  "always", "train_step"),
    ("tied",      4, 4, 1, "gpipe", "always", "forward"),
    ("tied",      4, 2, 4, "1f1b",  "never",  "train_step"),
    ("forkjoin",  1, 1, 4, "gpipe", "always", "forward"),
    ("forkjoin",  2, 2, 1, "1f1b",  "never",  "train_step"),
    ("forkjoin",  4, 4, 4, "gpipe", "never",  "forward"),
    ("withloss",  1, 1, 4, "1f1b",  "always", "train_step"),
    ("withloss",  2, 2, 4, "gpipe", "never",  "forward"),
    ("withloss",  2, 1, 1, "1f1b",  "never",  "train_step"),
    ("withloss",  4, 4, 4, "1f1b",  "always", "train_step"),
    ("withloss",  4, 2, 1, "gpipe", "always", "train_step"),
    ("scripted",  1, 1, 1, "1f1b",  "never",  "train_step"),
    ("scripted",  2, 2, 4, "gpipe", "always", "forward"),
    ("scripted",  4, 4, 1, "gpipe", "never",  "forward"),
    ("scripted",  4, 1, 4, "1f1b",  "always", "train_step"),
]

# Interleaved 1F1B (virtual_stages=2, issue 19): partition_num counts every virtual stage, so it
# is twice the pipeline positions; the micro-batch count is a multiple of the positions.
#  model       ranks partition pipeline schedule recompute call
INTERLEAVED = [
    ("mlp",       2, 4, 2, "1f1b",  "never",  "train_step"),
    ("encoder",   4, 4, 4, "1f1b",  "always", "train_step"),  # 2 positions x 2 replicas
    ("tied",      4, 8, 4, "1f1b",  "never",  "train_step"),  # 4 positions
    ("resnet18",  2, 4, 4, "1f1b",  "never",  "train_step"),
    ("cnn_bn",    4, 4, 2, "1f1b",  "never",  "train_step"),  # BatchNorm over 2 replicas
    ("withloss",  2, 4, 2, "1f1b",  "always", "train_step"),
]


def describe(config):
    model, ranks, partition, pipeline, schedule, recompute, call = config
    return (f"{model} ranks={ranks} partition_num={partition} pipeline_num={pipeline} "
            f"schedule={schedule} recompute={recompute} call={call}")


class Mismatch:
    """The largest error seen and the comparisons that failed."""

    def __init__(self):
        self.max_error = 0.0
        self.failures = []

    def check(self, what, got, expected):
        # On the CPU: with AUTOSTAGE_DEVICE=cuda (scripts/test-gpu) autostage's tensors are CUDA
        got, expected = got.detach().cpu(), expected.detach().cpu()
        if got.shape != expected.shape:
            self.failures.append(f"{what}: shape {tuple(got.shape)} vs {tuple(expected.shape)}")
            return
        error = (got.double() - expected.double()).abs().max().item() if got.numel() else 0.0
        self.max_error = max(self.max_error, error)
        if not torch.allclose(got, expected, rtol=RTOL, atol=ATOL):
            self.failures.append(f"{what} (max error {error:.3g})")


def check_deployment(wrapped, config, mismatch, virtual):
    _, ranks, partition, pipeline, schedule, recompute, _ = config
    info = wrapped._impl.deployment_info()
    if info["virtual_stages"] != virtual:
        mismatch.failures.append(f"planned virtual_stages={info['virtual_stages']}, forced {virtual}")
    stages = info["stages"]
    if len(stages) != partition:
        mismatch.failures.append(f"planned {len(stages)} stages, forced {partition}")
    if info["micro_batches"] != pipeline:
        mismatch.failures.append(f"planned {info['micro_batches']} micro-batches, forced {pipeline}")
    if info["schedule"] != schedule:
        mismatch.failures.append(f"planned schedule {info['schedule']}, forced {schedule}")
    if any(s["recompute"] != (recompute == "always") for s in stages):
        mismatch.failures.append(f"stage recompute flags {[s['recompute'] for s in stages]}")
    return info


def local_names(model, wrapped):
    """state_dict names of this rank's parameters and buffers (the tensors are shared)."""
    by_ptr = {t.data_ptr(): n for n, t in model.state_dict(keep_vars=True).items()}
    return [by_ptr[t.data_ptr()] for t in wrapped._impl.local_tensors()]


def run_step(wrapped, spec, call, inputs, target):
    if call == "train_step":
        return wrapped.train_step(*inputs)
    out = wrapped(*inputs)
    (out if spec.returns_loss else spec.loss(out, target)).backward()
    return out


def run_config(config, cache_dir, rank, world, virtual=1):
    name, _, partition, pipeline, schedule, recompute, call = config
    spec = MODELS[name] if call == "forward" else with_loss(MODELS[name])
    model = spec.build()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    reference = ReferenceRun(spec, LR)
    wrapped = autostage.Module(
        model, optimizer, partition_num=partition, pipeline_num=pipeline, schedule=schedule,
        recompute=recompute, virtual_stages=virtual, profile_cache_dir=cache_dir, profile_repeats=3,
        profile_pass_seconds=0, profile_batch_sizes="", decomposer="dp", mem_limit_gb=0, comm_timeout_s=600)
    mismatch = Mismatch()
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    names, params = None, None
    for step in range(STEPS):
        inputs, target = spec.batch(world * LOCAL_BATCH, step)
        optimizer.zero_grad()
        out = run_step(wrapped, spec, call, tuple(t[rows] for t in inputs),
                       None if target is None else target[rows])
        if names is None:
            info = check_deployment(wrapped, config, mismatch, virtual)
            names = local_names(model, wrapped)
            params = dict(model.named_parameters())
            reference.split_batchnorm(info, world * LOCAL_BATCH)
        ref_out = reference.step_forward_backward(inputs, target)
        mismatch.check(f"step {step} output", out, ref_out if spec.returns_loss else ref_out[rows])
        for n in names:
            if n in params:
                grad = params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])
                mismatch.check(f"step {step} grad {n}", grad, reference.grad(n))
        optimizer.step()
        reference.optimizer_step()
        state = model.state_dict(keep_vars=True)
        for n in names:
            if n in params or step == STEPS - 1:
                mismatch.check(f"step {step} value {n}", state[n], reference.tensor(n))
    return mismatch, len(names)


def expect_plan_error(cache_dir, rank, world):
    """partition_num larger than the world size: a clear error on every rank, no hang."""
    spec = MODELS["mlp"]
    wrapped = autostage.Module(spec.build(), None, partition_num=world * 2, pipeline_num=1,
                               schedule="gpipe", recompute="never", profile_cache_dir=cache_dir)
    inputs, _ = spec.batch(world * LOCAL_BATCH, 0)
    try:
        wrapped(inputs[0][:LOCAL_BATCH])
    except autostage.Error as e:
        say(f"rank {rank}: ok partition_num={world * 2} on {world} ranks raised "
            f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return True
    say(f"rank {rank}: FAIL partition_num={world * 2} on {world} ranks did not raise")
    return False


def main():
    cache_dir = sys.argv[1]
    only = sys.argv[2] if len(sys.argv) > 2 else None
    rank, world = autostage.get_rank(), autostage.get_world_size()
    torch.set_num_threads(1)
    failed = 0
    rows = [("config", index, config, 1) for index, config in enumerate(CONFIGS)]
    rows += [("interleaved", index, config, 2) for index, config in enumerate(INTERLEAVED)]
    for label, index, config, virtual in rows:
        if config[1] != world or (only and config[0] != only):
            continue
        what = f"{label} {index} [{describe(config)}{' virtual_stages=2' if virtual > 1 else ''}]"
        try:
            mismatch, count = run_config(config, cache_dir, rank, world, virtual)
        except Exception as e:  # report and go on: the next config starts a fresh module
            traceback.print_exc()
            say(f"rank {rank}: FAIL {what}: {type(e).__name__}: {e}")
            failed += 1
            continue
        status = "FAIL" if mismatch.failures else "ok"
        failed += bool(mismatch.failures)
        detail = "; ".join(mismatch.failures[:None if VERBOSE else 4])
        say(f"rank {rank}: {status} {what} {count} local tensors, "
            f"max error {mismatch.max_error:.3g}{': ' + detail if detail else ''}")
    if world > 1 and not only and not expect_plan_error(cache_dir, rank, world):
        failed += 1
    autostage.barrier()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
