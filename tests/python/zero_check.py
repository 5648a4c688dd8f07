"""Run under mpirun (see test_zero.py): ZeRO-1 in replicated stages against plain single-process
PyTorch (rtol 1e-5). Phases:

- `train OPT`: OPT = adam | sgd (SGD with momentum). 4 steps with gradient accumulation (2
  batches under delay_grad_allreduce) and global clipping; each step compares the outputs, the
  gradients each replica owns, the parameters after the step and the optimizer's global state
  (state_dict(from_global=True)) with plain PyTorch. The deployment must run ZeRO-1 in a stage
  with replicas.
- `auto OPT`: the same with zero=auto under a memory limit only ZeRO-1 fits (AUTO_OPTIONS).
- `save PATH`: 3 Adam steps under ZeRO-1, then rank 0 saves the model's and the optimizer's
  global state. `resume PATH`: on another rank count, loads both and trains 3 more steps; the
  result must equal 6 plain steps.
"""
import sys

import torch

import autostage
from mpi_launch import finish
from device_under_test import host

LOCAL, LR, MAX_NORM, ACCUMULATE = 4, 0.05, 0.2, 2
RTOL, ATOL = 1e-5, 1e-6


class Net(torch.nn.Module):
    """Odd layer sizes, so the replicas' pieces cut parameters in the middle."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(6, 13), torch.nn.Tanh(), torch.nn.Linear(13, 11), torch.nn.Tanh(),
            torch.nn.Linear(11, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3))

    def forward(self, x):
        return self.layers(x)


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=0.01)
    return torch.optim.Adam(params, lr=LR, weight_decay=0.01)


def batch(step, k, world_rows):
    g = torch.Generator().manual_seed(1000 + 10 * step + k)
    return torch.randn(world_rows, 6, generator=g), torch.randn(world_rows, 3, generator=g)


# `auto` phase: the optimizer counts 200 bytes per parameter byte, and the limit (about 230 kB)
# holds a stage's optimizer state only when it is split over 2 replicas (the rest of the stage
# needs a few kB), so with zero=auto the planner must pick ZeRO-1.
ONLY_SHARDED_FITS = {"opt_param_factor": 200, "mem_limit_gb": 230e3 / 2**30, "mem_margin": 0}
AUTO_OPTIONS = dict(ONLY_SHARDED_FITS, zero="auto")


def wrap(model, optimizer, world, **options):
    # Small buckets give several per stage. 2 ranks: one stage on both; 4 ranks: 2 stages. The
    # DP replicates a stage only where the measured times say a second replica is faster, and this
    # model's microseconds of compute measure flat on a loaded machine (CI runs planned one
    # replica and left ranks idle, even with communication made free). So with zero=1 on 4 ranks
    # the uniform planner fixes 2 replicas per stage, and on 2 ranks (and for zero=auto) the
    # memory limit decides: only the optimizer state split over the replicas fits.
    options = dict({"zero": 1}, **options)
    if world <= 2:
        options = dict(ONLY_SHARDED_FITS, **options)
    elif options["zero"] == 1:
        options["decomposer"] = "uniform"
    return autostage.Module(model, optimizer, partition_num=1 if world <= 2 else 2,
                            pipeline_num=1, schedule="gpipe", recompute="never",
                            comm_latency=0, comm_bandwidth=1e15, allreduce_bandwidth=1e15,
                            gradient_bucket_bytes=256, **options)


def close(a, b):
    return torch.allclose(host(a).double(), host(b).double(), rtol=RTOL, atol=ATOL)


def compare_state(got, want, what, failures):
    if sorted(got["state"]) != sorted(want["state"]):
        failures.append(f"{what}: state indices {sorted(got['state'])} != {sorted(want['state'])}")
        return
    for index, entry in want["state"].items():
        for key, value in entry.items():
            mine = got["state"][index].get(key)
            if isinstance(value, torch.Tensor):
                ok = isinstance(mine, torch.Tensor) and mine.shape == value.shape and \
                    close(mine, value)
            else:
                ok = mine == value
            if not ok:
                failures.append(f"{what}: state[{index}][{key}] = {mine} != plain {value}")
    if [g["params"] for g in got["param_groups"]] != [g["params"] for g in want["param_groups"]]:
        failures.append(f"{what}: param_groups differ")


def in_zero_stage(wrapped, rank):
    return any(s["zero"] and rank in s["ranks"] for s in wrapped._impl.deployment_info()["stages"])


def check_zero_deployed(wrapped, failures):
    stages = wrapped._impl.deployment_info()["stages"]
    if not any(s["zero"] and len(s["ranks"]) > 1 for s in stages):
        failures.append(f"no replicated stage runs ZeRO-1: {stages}")


def train_phase(kind, rank, world, **options):
    model, reference = Net(), Net()
    optimizer = make_optimizer(kind, model.parameters())
    ref_opt = make_optimizer(kind, reference.parameters())
    wrapped = wrap(model, optimizer, world, **options)
    rows = slice(rank * LOCAL, (rank + 1) * LOCAL)
    failures = []
    for step in range(4):
        autostage.delay_grad_allreduce(True)
        for k in range(ACCUMULATE):
            x, y = batch(step, k, world * LOCAL)
            ref_out = reference(x)
            torch.nn.functional.mse_loss(ref_out, y).backward()
            out = wrapped(x[rows])
            if not close(out.detach(), ref_out[rows].detach()):
                failures.append(f"step {step}.{k}: outputs differ")
            torch.nn.functional.mse_loss(out, y[rows]).backward()
        autostage.delay_grad_allreduce(False)
        wrapped.allreduce_grads()
        if step == 0:
            check_zero_deployed(wrapped, failures)
        ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM).item()
        norm = wrapped.clip_grad_norm(MAX_NORM)
        if abs(norm - ref_norm) > RTOL * ref_norm:
            failures.append(f"step {step}: global norm {norm} != plain {ref_norm}")
        ref_grads = {p.data_ptr(): q.grad for p, q in zip(model.parameters(),
                                                          reference.parameters())}
        owned = 0
        for _, param, offset, length in wrapped._shards.values():
            want = ref_grads[param.data_ptr()].reshape(-1)[offset:offset + length]
            owned += length
            if not close(param.grad.reshape(-1)[offset:offset + length], want):
                failures.append(f"step {step}: owned gradient piece ({offset}+{length}) differs")
        if owned == 0 and in_zero_stage(wrapped, rank):
            failures.append(f"step {step}: this rank owns no gradient piece")
        optimizer.step()
        ref_opt.step()
        optimizer.zero_grad()
        ref_opt.zero_grad()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            if p.data_ptr() in {t.data_ptr() for t in wrapped.local_parameters()} and \
                    not close(p, q):
                failures.append(f"step {step}: parameter {name} differs by "
                                f"{(p - q).abs().max()}")
        compare_state(optimizer.state_dict(from_global=True), ref_opt.state_dict(),
                      f"step {step} optimizer", failures)
    state = wrapped.state_dict()
    for name, q in reference.state_dict().items():
        if not close(state[name], q):
            failures.append(f"gathered {name} differs")
    # An eval deployment in between (Note [Train and eval deployments]) and back: the next
    # training step still equals plain PyTorch.
    x, y = batch(9, 0, world * LOCAL)
    wrapped.eval()
    reference.eval()
    with torch.no_grad():
        if not close(wrapped(x[rows]), reference(x)[rows]):
            failures.append("eval output differs after training")
    wrapped.train()
    reference.train()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    torch.nn.functional.mse_loss(wrapped(x[rows]), y[rows]).backward()
    optimizer.step()
    ref_opt.step()
    gathered = wrapped.state_dict()
    for name, q in reference.state_dict().items():
        if not close(gathered[name], q):
            failures.append(f"after eval and a step: {name} differs")
    compare_state(optimizer.state_dict(from_global=True), ref_opt.state_dict(),
                  "after eval and a step: optimizer", failures)
    return failures


def plain(steps):
    model = Net()
    optimizer = make_optimizer("adam", model.parameters())
    for step in range(steps):
        x, y = batch(step, 0, 16)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return model, optimizer


def run_steps(wrapped, optimizer, first, steps, rank, world):
    rows = 16 // world
    mine = slice(rank * rows, (rank + 1) * rows)
    for step in range(first, first + steps):
        x, y = batch(step, 0, 16)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(wrapped(x[mine]), y[mine]).backward()
        optimizer.step()


def save_phase(path, rank, world):
    model = Net()
    optimizer = make_optimizer("adam", model.parameters())
    wrapped = wrap(model, optimizer, world)
    run_steps(wrapped, optimizer, 0, 3, rank, world)
    failures = []
    check_zero_deployed(wrapped, failures)
    state = {"model": wrapped.state_dict(), "optimizer": optimizer.state_dict(from_global=True)}
    reference, ref_opt = plain(3)
    compare_state(state["optimizer"], ref_opt.state_dict(), "saved optimizer", failures)
    if rank == 0:
        torch.save(state, path)
    autostage.barrier()
    return failures


def resume_phase(path, rank, world):
    state = torch.load(path)
    model = Net()
    optimizer = make_optimizer("adam", model.parameters())
    wrapped = wrap(model, optimizer, world)
    # Before deployment: loaded into the full optimizer, split into shards when deployed.
    wrapped.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"], from_global=True)
    run_steps(wrapped, optimizer, 3, 3, rank, world)
    failures = []
    check_zero_deployed(wrapped, failures)
    reference, ref_opt = plain(6)
    gathered = wrapped.state_dict()
    for name, q in reference.state_dict().items():
        if not close(gathered[name], q):
            failures.append(f"resumed {name} differs by {(gathered[name] - q).abs().max()}")
    compare_state(optimizer.state_dict(from_global=True), ref_opt.state_dict(),
                  "resumed optimizer", failures)
    return failures


def main():
    phase, arg = sys.argv[1], sys.argv[2]
    rank, world = autostage.get_rank(), autostage.get_world_size()
    if phase == "train":
        failures = train_phase(arg, rank, world)
    elif phase == "auto":
        failures = train_phase(arg, rank, world, **AUTO_OPTIONS)
    elif phase == "save":
        failures = save_phase(arg, rank, world)
    else:
        failures = resume_phase(arg, rank, world)
    print(f"rank {rank}: zero {phase} checked; {len(failures)} failures", flush=True)
    finish(rank, failures)


if __name__ == "__main__":
    main()
