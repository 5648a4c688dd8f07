"""Run under mpirun (see test_deployment_file.py). Modes:
  dryrun PATH          plan with partitioning_dry_run_np (from the environment); must not return
  train PATH           load_deployment=true (environment) on 4 ranks: 3 Adam steps == plain PyTorch
  mismatch DIR         loading deployments that do not fit this job names the field; save_deployment
"""

import os
import sys

import torch

import autostage
from mpi_launch import finish

HIDDEN, LOCAL = 16, 8


def make(hidden=HIDDEN):
    torch.manual_seed(11)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(hidden, hidden),
                                                     torch.nn.ReLU()) for _ in range(4)])


class LossModel(torch.nn.Module):
    """make() with an MSE loss inside (train_step needs a model returning its loss)."""

    def __init__(self):
        super().__init__()
        self.net = make()

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.net(x), y)


def no_grad(module, *inputs):
    with torch.no_grad():
        return module(*inputs)


def data(seed, rows, hidden=HIDDEN):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, hidden, generator=g), torch.randn(rows, hidden, generator=g)


def dry_run(rank, world):
    model = autostage.Module(make())
    x, _ = data(0, LOCAL)
    model(x)
    print("FAIL: the dry run returned from the first call", flush=True)
    sys.exit(3)


def train(rank, world, failures):
    model, reference = make(), make()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    wrapped = autostage.Module(model, optimizer)
    rows = slice(rank * LOCAL, (rank + 1) * LOCAL)
    for step in range(3):
        x, y = data(step, world * LOCAL)
        out = wrapped(x[rows])
        if not torch.allclose(out.detach(), reference(x)[rows].detach(), rtol=1e-5, atol=1e-6):
            failures.append(f"step {step}: output differs from plain")
        torch.nn.functional.mse_loss(out, y[rows]).backward()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        optimizer.step()
        ref_opt.step()
        optimizer.zero_grad()
        ref_opt.zero_grad()
    state = wrapped.state_dict()
    for key, value in reference.state_dict().items():
        if not torch.allclose(state[key], value, rtol=1e-5, atol=1e-6):
            failures.append(f"after 3 steps {key} differs from plain by "
                            f"{(state[key] - value).abs().max()}")
    info = wrapped._impl.deployment_info()
    if info["world_size"] != 4 or len(info["stages"]) < 2:
        failures.append(f"the loaded deployment is not the dry run's 4-rank plan: {info}")


def expect_error(failures, what, words, call):
    try:
        call()
    except autostage.Error as e:
        if not all(w in str(e) for w in words):
            failures.append(f"{what}: error does not say {words}: {e}")
        if autostage.get_rank() == 0:  # the message, for docs/errors.md
            print(f"ERROR {what}: {type(e).__name__}: {e}", flush=True)
        return
    failures.append(f"{what}: no error")


def mismatch(rank, world, failures, directory):
    np2, np4 = os.path.join(directory, "np2.deployment"), os.path.join(directory, "np4.deployment")
    x, _ = data(0, LOCAL)
    expect_error(failures, "world size", ["world_size is 2", "4 ranks"],
                 lambda: autostage.Module(make(), load_deployment=np2)(x))
    expect_error(failures, "batch size", ["batch_size is 32", "global batch is 16"],
                 lambda: autostage.Module(make(), load_deployment=np4)(x[:4]))
    expect_error(failures, "device memory", ["device_memory is 1073741824", "536870912"],
                 lambda: autostage.Module(make(), load_deployment=np4, mem_limit_gb=0.5)(x))
    autostage._autostage._set_option("mem_limit_gb", "1")  # the budget the plans were made for
    x8, _ = data(0, LOCAL, hidden=8)
    expect_error(failures, "graph hash", ["graph_hash is"],
                 lambda: autostage.Module(make(8), load_deployment=np4)(x8))
    # A deployment must fit the call that runs it (Note [Plan usage]): a 1F1B plan made for
    # train_step cannot run through forward()/backward(), an inference plan cannot train.
    y = torch.randn_like(x)
    for name, options, run in (("1f1b", {"schedule": "1f1b", "pipeline_num": 2},
                                lambda m: m.train_step(x, y)),
                               ("inference", {}, lambda m: no_grad(m, x, y))):
        path = os.path.join(directory, f"{name}.deployment")
        source = autostage.Module(LossModel(), **options)
        run(source)
        if autostage.get_rank() == 0:
            source.save_deployment(path)
        autostage.barrier()
        for key, value in (("schedule", "auto"), ("pipeline_num", "0")):  # options are global
            autostage._autostage._set_option(key, value)
        words = (["schedule 1f1b", "forward()", "train_step"] if name == "1f1b"
                 else ["planned for inference", "trains"])
        expect_error(failures, f"a {name} deployment through forward()", words,
                     lambda: autostage.Module(LossModel(), load_deployment=path)(x, y).backward())
    # save_deployment: rank 0 writes the plan it made to deployment_file.
    saved = os.path.join(directory, "saved.deployment")
    wrapped = autostage.Module(make(), save_deployment=True, deployment_file=saved)
    wrapped(x)
    autostage.barrier()
    info = autostage._autostage._read_deployment(saved)
    if info["world_size"] != 4 or info["batch_size"] != 4 * LOCAL:
        failures.append(f"save_deployment wrote {info}")
    if info["stages"] != wrapped._impl.deployment_info()["stages"]:
        failures.append("save_deployment's file differs from the deployment in use")


def main():
    mode, path = sys.argv[1], sys.argv[2]
    rank, world = autostage.get_rank(), autostage.get_world_size()
    failures = []
    if mode == "dryrun":
        dry_run(rank, world)
    elif mode == "train":
        train(rank, world, failures)
    else:
        mismatch(rank, world, failures, path)
    print(f"rank {rank}: {mode} checked; {len(failures)} failures", flush=True)
    finish(rank, failures)


if __name__ == "__main__":
    main()
