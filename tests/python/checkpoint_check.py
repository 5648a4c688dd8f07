"""Run under mpirun (see test_checkpoint.py). `save PATH`: train 3 steps, check the gathered
state_dict against plain PyTorch and save it. `resume PATH`: on another rank count, load it and
train 3 more steps; the result must equal 6 uninterrupted plain steps; a checkpoint of a wider
model is then refused on every rank and changes nothing. Each phase does this twice: with SGD and
a BatchNorm model (one stage per rank), saving and loading through autostage.save_checkpoint /
load_checkpoint, and with Adam on an MLP with 2 stages (replicated on 4 ranks), saving the
optimizer's global state (state_dict(from_global=True))."""
import copy
import sys

import torch

import autostage
from mpi_launch import finish
from device_under_test import host, allclose, equal

STEPS, LOCAL, LR = 3, 4, 0.05


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(),
            torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
            torch.nn.Linear(16, 3))

    def forward(self, x):
        return self.layers(x)


def batch(step, world):
    # The global batch does not depend on the rank count: 16 rows per step.
    g = torch.Generator().manual_seed(500 + step)
    x, y = torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)
    return x, y


def train(wrapped, optimizer, first, steps, rank, world):
    rows = 16 // world
    for step in range(first, first + steps):
        x, y = batch(step, world)
        optimizer.zero_grad()
        mine = slice(rank * rows, (rank + 1) * rows)
        torch.nn.functional.mse_loss(wrapped(x[mine]), y[mine]).backward()
        optimizer.step()


def plain(steps):
    # BatchNorm in train mode: one full-batch piece per step (the runs below use 1 micro-batch and
    # a single replica on the BatchNorm stage, so the statistics are those of the whole batch).
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch(step, 1)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return model


def compare(state, reference, what, failures):
    ref = reference.state_dict()
    if list(state.keys()) != list(ref.keys()):
        failures.append(f"{what}: keys {list(state.keys())} != {list(ref.keys())}")
        return
    for key, value in ref.items():
        if key.endswith("num_batches_tracked"):
            # Known gap (docs/runtime.md, BatchNorm): the runtime does not advance it; it only matters for
            # BatchNorm with momentum=None. It must still be present, with its dtype.
            if state[key].dtype != value.dtype:
                failures.append(f"{what}: {key} has dtype {state[key].dtype}, not {value.dtype}")
            continue
        if not torch.allclose(host(state[key]).double(), host(value).double(), rtol=1e-5, atol=1e-6):
            failures.append(f"{what}: {key} differs by {(state[key] - value).abs().max()}")


def refuse_mismatched(wrapped, wide_path, rank, failures):
    """A checkpoint of a wider model is refused on every rank, naming the key and both shapes,
    and no stage's parameters change."""
    wide = Net()
    wide.layers[7] = torch.nn.Linear(16, 5)
    autostage.save_checkpoint(wide, wide_path)
    autostage.barrier()  # rank 0 has written it
    before = wrapped.state_dict()
    try:
        autostage.load_checkpoint(wide_path, wrapped)
        failures.append("a checkpoint of a wider model was loaded")
    except autostage.FormatError as e:
        expected = "'layers.7.weight' has shape [5, 16] in the checkpoint but [3, 16] in the model"
        if expected not in str(e) or "Nothing was loaded" not in str(e):
            failures.append(f"unexpected message: {e}")
    after = wrapped.state_dict()
    changed = [k for k in before if not equal(before[k], after[k])]
    if changed:
        failures.append(f"refused checkpoint changed {changed}")


def main():
    phase, path = sys.argv[1], sys.argv[2]
    rank, world = autostage.get_rank(), autostage.get_world_size()
    failures = []
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    # One stage per rank: the BatchNorm stage has a single replica and one micro-batch, so its
    # statistics are those of the whole batch, as in the plain run.
    wrapped = autostage.Module(model, optimizer, partition_num=world, pipeline_num=1,
                               schedule="gpipe", recompute="never")
    if phase == "save":
        if wrapped.state_dict().keys() != Net().state_dict().keys():
            failures.append("state_dict before deployment lacks the model's keys")
        train(wrapped, optimizer, 0, STEPS, rank, world)
        state = wrapped.state_dict()
        compare(state, plain(STEPS), f"state_dict after {STEPS} steps", failures)
        fresh = Net()
        fresh.load_state_dict(state)  # strict: the plain model takes it as is
        wrote = autostage.save_checkpoint(state, path)  # only rank 0 writes
        if wrote != (rank == 0):
            failures.append(f"save_checkpoint returned {wrote} on rank {rank}")
    else:
        autostage.load_checkpoint(path, wrapped)  # before deployment
        train(wrapped, optimizer, STEPS, STEPS, rank, world)
        reference = plain(2 * STEPS)
        compare(wrapped.state_dict(), reference, f"resumed for {STEPS} more steps", failures)
        # Loading after deployment reaches every rank's stages: back to the saved state.
        autostage.load_checkpoint(path, wrapped)
        compare(wrapped.state_dict(), plain(STEPS), "loaded after deployment", failures)
        refuse_mismatched(wrapped, path + ".wide", rank, failures)
    check_adam(phase, path, rank, world, failures)
    print(f"rank {rank}: checkpoint {phase} checked; {len(failures)} failures", flush=True)
    finish(rank, failures)


# ---- Adam: optimizer state in PyTorch's global layout ----------------------------------------

ADAM_LR = 0.01


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
            torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

    def forward(self, x):
        return self.layers(x)


def plain_adam(steps):
    model = Mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=ADAM_LR)
    for step in range(steps):
        x, y = batch(step, 1)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return model, optimizer


def compare_optimizer(got, expected, what, failures):
    """`got` and `expected` are optimizer state dicts in PyTorch's layout."""
    if got["param_groups"] != expected["param_groups"]:
        failures.append(f"{what}: param_groups {got['param_groups']} != "
                        f"{expected['param_groups']}")
    if sorted(got["state"]) != sorted(expected["state"]):
        failures.append(f"{what}: state indices {sorted(got['state'])} != "
                        f"{sorted(expected['state'])}")
        return
    for index, entry in expected["state"].items():
        if list(got["state"][index]) != list(entry):
            failures.append(f"{what}: state[{index}] keys {list(got['state'][index])} != "
                            f"{list(entry)}")
            continue
        for key, value in entry.items():
            mine = got["state"][index][key]
            if mine.dtype != value.dtype or not allclose(mine, value, rtol=1e-5, atol=1e-7):
                failures.append(f"{what}: state[{index}][{key!r}] {mine.dtype} differs from "
                                f"{value.dtype} by {(mine.double() - value.double()).abs().max()}")


def check_adam(phase, path, rank, world, failures):
    model_path, optim_path = path + ".adam-model", path + ".adam-optim"
    model = Mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=ADAM_LR)
    # Free communication makes replicas pay off: on 4 ranks, 2 stages x 2 replicas, whose
    # replicas hold the same optimizer state (the gather takes one).
    wrapped = autostage.Module(model, optimizer, partition_num=2, pipeline_num=1,
                               schedule="gpipe", recompute="never", comm_latency=0,
                               comm_bandwidth=1e15, allreduce_bandwidth=1e15)
    if phase == "save":
        train(wrapped, optimizer, 0, STEPS, rank, world)
        state = wrapped.state_dict()
        optim_state = optimizer.state_dict(from_global=True)
        reference, ref_optimizer = plain_adam(STEPS)
        compare(state, reference, "Adam: state_dict after 3 steps", failures)
        compare_optimizer(optim_state, ref_optimizer.state_dict(), "Adam: optimizer state after "
                          "3 steps", failures)
        local = optimizer.state_dict()  # without the flag: PyTorch's, for this rank's share
        if len(local["state"]) != len([p for g in optimizer.param_groups for p in g["params"]]):
            failures.append("Adam: the local state_dict does not cover this rank's parameters")
        # The saved dicts load into the plain model and a plain Adam, which then steps like the
        # uninterrupted reference.
        fresh = Mlp()
        fresh.load_state_dict(state)
        fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=ADAM_LR)
        # PyTorch 2.x's load_state_dict keeps the dict's tensors (1.13 copied them): stepping
        # fresh_optimizer would advance optim_state's own `step` before it is saved.
        fresh_optimizer.load_state_dict(copy.deepcopy(optim_state))
        compare_optimizer(fresh_optimizer.state_dict(), ref_optimizer.state_dict(),
                          "Adam: a plain optimizer loaded with the gathered state", failures)
        for model_, optimizer_ in ((fresh, fresh_optimizer), (reference, ref_optimizer)):
            x, y = batch(STEPS, 1)
            optimizer_.zero_grad()
            torch.nn.functional.mse_loss(model_(x), y).backward()
            optimizer_.step()
        compare(fresh.state_dict(), reference, "Adam: a plain model stepping from the gathered "
                "state", failures)
        if rank == 0:
            torch.save(state, model_path)
            torch.save(optim_state, optim_path)
        return
    saved_model, saved_optim = torch.load(model_path), torch.load(optim_path)
    # A dict for other param groups is refused with a message naming the difference.
    group = saved_optim["param_groups"][0]
    for groups, message in (
            ([dict(group, params=[0, 1])], "param_groups[0] of the optimizer state dict has 2 "
             "parameter(s) but the optimizer's has 8; load a state dict saved from an optimizer "
             "over the same model's parameters"),
            ([group, dict(group, params=[])], "the optimizer state dict has 2 parameter group(s) "
             "but the optimizer has 1; load a state dict saved from an optimizer with the same "
             "param_groups")):
        try:
            optimizer.load_state_dict(dict(saved_optim, param_groups=groups), from_global=True)
            failures.append(f"Adam: a state dict was loaded although {message}")
        except autostage.ConfigError as e:
            if message not in str(e):
                failures.append(f"Adam: unexpected message for a bad state dict: {e}")
    wrapped.load_state_dict(saved_model)  # before deployment
    optimizer.load_state_dict(copy.deepcopy(saved_optim), from_global=True)  # 2.x keeps tensors
    train(wrapped, optimizer, STEPS, STEPS, rank, world)
    reference, ref_optimizer = plain_adam(2 * STEPS)
    compare(wrapped.state_dict(), reference, "Adam: resumed for 3 more steps", failures)
    compare_optimizer(optimizer.state_dict(from_global=True), ref_optimizer.state_dict(),
                      "Adam: optimizer state after resuming for 3 more steps", failures)
    # Loading after deployment scatters the entries to their owners: back to the saved state.
    optimizer.load_state_dict(copy.deepcopy(saved_optim), from_global=True)
    compare_optimizer(optimizer.state_dict(from_global=True), saved_optim,
                      "Adam: optimizer state loaded after deployment", failures)


if __name__ == "__main__":
    main()
