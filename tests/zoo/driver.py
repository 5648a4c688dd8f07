"""Model zoo driver: under mpirun, trains every catalog model planned for this rank count with
autostage.Module and compares it with the same model trained in one plain PyTorch process.

Run: mpirun -np N python driver.py RESULTS_DIR [MODEL]  (test_zoo.py does it). Per config (a
model and a plan shape): a fresh float64 model, autostage.Module with partition_num and
pipeline_num forced, STEPS SGD-with-momentum steps, each compared on every rank within
RTOL/ATOL: every output leaf (this rank's rows, or the global value of a scalar such as a loss),
the gradient of every local parameter, every local parameter after the step and, at the end,
every local buffer. Each rank writes RESULTS_DIR/rank<r>.jsonl, one JSON object per config.
"""
import json
import os
import sys
import time
import traceback

import torch

import autostage
from catalog import configs
from zoo_reference import ZooReference, leaves

RTOL, ATOL, STEPS, LR = 1e-9, 1e-11, 2, 0.05
# A float32 value among the float64 ones (transformers computes its loss from logits.float()):
# micro-batches sum it in another order, which float32 rounding alone moves by ~1e-7.
FLOAT32_RTOL, FLOAT32_ATOL = 1e-5, 1e-6


# The options an entry may set, at their defaults: options are process-wide, so each config sets
# them all (an entry's tensor_parallel=4 must not reach the next entry's plans).
ENTRY_OPTION_DEFAULTS = {"front_end": "auto", "tensor_parallel": 1}


def optimizer_for(params):
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


class Mismatch:
    def __init__(self):
        self.max_error, self.failures, self.compared = 0.0, [], 0

    def check(self, what, got, expected):
        if got is None or expected is None:
            if (got is None) != (expected is None):
                self.failures.append(f"{what}: {got!r} vs {expected!r}")
            return
        if not isinstance(got, torch.Tensor):
            if got != expected:
                self.failures.append(f"{what}: {got!r} vs {expected!r}")
            return
        got, expected = got.detach(), expected.detach()
        self.compared += 1
        if got.shape != expected.shape or got.dtype != expected.dtype:
            self.failures.append(f"{what}: {got.dtype}{list(got.shape)} vs "
                                 f"{expected.dtype}{list(expected.shape)}")
            return
        if got.is_floating_point() and got.numel():
            scale = expected.abs().max().item()
            error = (got - expected).abs().max().item() / max(scale, 1.0)
            self.max_error = max(self.max_error, error)
        single = got.dtype == torch.float32
        rtol, atol = (FLOAT32_RTOL, FLOAT32_ATOL) if single else (RTOL, ATOL)
        if not torch.allclose(got.double(), expected.double(), rtol=rtol, atol=atol):
            self.failures.append(f"{what} (max abs error "
                                 f"{(got.double() - expected.double()).abs().max().item():.3g})")


def compare_outputs(mismatch, step, out, ref_out, rows):
    got, expected = leaves(out), leaves(ref_out)
    if [p for p, _ in got] != [p for p, _ in expected]:
        mismatch.failures.append(f"step {step}: output structure {[p for p, _ in got]} vs "
                                 f"{[p for p, _ in expected]}")
        return
    if type(out) is not type(ref_out):
        mismatch.failures.append(f"step {step}: output type {type(out).__name__} vs "
                                 f"{type(ref_out).__name__}")
    for (path, g), (_, e) in zip(got, expected):
        if isinstance(e, torch.Tensor) and e.dim() > 0:
            e = e[rows]
        mismatch.check(f"step {step} output{path}", g, e)


def run_config(entry, partition, pipeline, call, cache_dir, rank, world):
    model = entry.model()
    optimizer = optimizer_for(model.parameters())
    reference = ZooReference(entry, optimizer_for)
    wrapped = autostage.Module(
        model, optimizer, partition_num=partition, pipeline_num=pipeline,
        schedule="1f1b" if call == "train_step" else "gpipe", recompute="never", profile_cache_dir=cache_dir, profile_repeats=3, profile_passes=1,
        profile_pass_seconds=0, profile_batch_sizes="", decomposer="dp", mem_limit_gb=0,
        **dict(ENTRY_OPTION_DEFAULTS, **entry.options))
    mismatch, info = Mismatch(), None

    def mine(name, whole):
        """Plain PyTorch's tensor cut to this rank's tensor-parallel slice where it holds one
        (Note [Tensor-parallel parameters]); whole otherwise."""
        return dict(wrapped._impl.slice_state([(name, whole)]))[name]

    local = entry.local_batch
    rows = slice(rank * local, (rank + 1) * local)
    for step in range(STEPS):
        args, kwargs, target = entry.batch(world * local, step)
        local_args = tuple(a[rows] for a in args)
        local_kwargs = {k: v[rows] if isinstance(v, torch.Tensor) else v
                        for k, v in kwargs.items()}
        optimizer.zero_grad()
        if call == "train_step":
            out = wrapped.train_step(*local_args, **local_kwargs)
        else:
            out = wrapped(*local_args, **local_kwargs)
            loss = out[entry.loss_key] if entry.loss is None else \
                entry.loss(out, None if target is None else target[rows])
            loss.backward()
        if info is None:
            info = wrapped._impl.deployment_info()
            reference.split_batchnorm(info, world * local)
            params = dict(model.named_parameters())
            # Non-persistent buffers (BERT's position_ids) are stage tensors outside state_dict.
            by_ptr = {t.data_ptr(): n for n, t in model.named_buffers()}
            by_ptr.update({t.data_ptr(): n
                           for n, t in model.state_dict(keep_vars=True).items()})
            # Tensors the model creates in forward (torch.export lifts them as constants, T5's)
            # are not model state: nothing to compare.
            names = [by_ptr[t.data_ptr()] for t in wrapped._impl.local_tensors()
                     if t.data_ptr() in by_ptr]
        ref_out = reference.step(args, kwargs, target)
        compare_outputs(mismatch, step, out, ref_out, rows)
        for n in names:
            if n in params:
                grad = params[n].grad
                mismatch.check(f"step {step} grad {n}",
                               grad if grad is not None else torch.zeros_like(params[n]),
                               mine(n, reference.grad(n)))
        optimizer.step()
        reference.optimizer_step()
        state = dict(model.named_buffers())
        state.update(model.state_dict(keep_vars=True))
        for n in names:
            if n in params or step == STEPS - 1:
                mismatch.check(f"step {step} value {n}", state[n], mine(n, reference.tensor(n)))
    if mismatch.compared == 0:
        mismatch.failures.append("nothing was compared")
    stages = info["stages"]
    if len(stages) != partition or info["micro_batches"] != pipeline:
        mismatch.failures.append(f"planned {len(stages)} stages x {info['micro_batches']} "
                                 f"micro-batches, forced {partition} x {pipeline}")
    degree = entry.options.get("tensor_parallel", 1)
    if any(s["tensor_parallel"] != degree for s in stages):
        mismatch.failures.append(f"stages at tensor_parallel {[s['tensor_parallel'] for s in stages]}"
                                 f", forced {degree}")
    elif degree > 1 and not wrapped._impl.held_slices():
        mismatch.failures.append(f"tensor_parallel={degree} but this rank holds no slices")
    return mismatch, [len(s["ranks"]) for s in stages]


def expect_plan_error(entry, partition, pipeline, cache_dir, rank, world):
    """A plan shape the model cannot have: PlanError on every rank, naming why."""
    model = entry.model()
    wrapped = autostage.Module(model, None, partition_num=partition, pipeline_num=pipeline,
                               **dict(ENTRY_OPTION_DEFAULTS, **entry.options),
                               profile_cache_dir=cache_dir, profile_repeats=3,
                               profile_passes=1, profile_pass_seconds=0)
    args, kwargs, _ = entry.batch(world * entry.local_batch, 0)
    rows = slice(rank * entry.local_batch, (rank + 1) * entry.local_batch)
    try:
        wrapped(*(a[rows] for a in args), **{k: v[rows] if isinstance(v, torch.Tensor) else v
                                             for k, v in kwargs.items()})
    except autostage.PlanError as e:
        return str(e).splitlines()[0]
    raise AssertionError(f"partition_num={partition} did not raise PlanError")


def main():
    results_dir = sys.argv[1]
    only = sys.argv[2] if len(sys.argv) > 2 else None
    rank, world = autostage.get_rank(), autostage.get_world_size()
    torch.set_num_threads(1)
    cache_dir = os.path.join(results_dir, "profiles")
    lines = []
    for entry, partition, pipeline, call in configs(world):
        if only and entry.name != only:
            continue
        started = time.time()
        result = {"model": entry.name, "ranks": world, "partition_num": partition,
                  "pipeline_num": pipeline, "call": call, "rank": rank}
        try:
            if call == "PlanError":
                result.update(ok=True, refused=expect_plan_error(
                    entry, partition, pipeline, cache_dir, rank, world))
            else:
                mismatch, replicas = run_config(entry, partition, pipeline, call, cache_dir,
                                                rank, world)
                result.update(ok=not mismatch.failures, max_error=mismatch.max_error,
                              compared=mismatch.compared, replicas=replicas,
                              failures=mismatch.failures[:4])
        except Exception as e:  # report and go on: the next config starts a fresh module
            traceback.print_exc()
            result.update(ok=False, failures=[f"{type(e).__name__}: {e}"])
        result["seconds"] = round(time.time() - started, 2)
        lines.append(json.dumps(result))
        print(f"rank {rank}: {'ok' if result['ok'] else 'FAIL'} {entry.name} "
              f"{partition}x{pipeline} {result.get('failures') or ''}", flush=True)
    with open(os.path.join(results_dir, f"rank{rank}.jsonl"), "w") as f:
        f.write("".join(line + "\n" for line in lines))
    autostage.barrier()


if __name__ == "__main__":
    main()
