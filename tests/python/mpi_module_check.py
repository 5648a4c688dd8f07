"""Run under mpirun (see test_module.py): autostage.Module on N ranks vs plain PyTorch."""
import os
import tempfile

import torch

import autostage
from mpi_launch import finish
from device_under_test import allclose


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.Tanh(),
        torch.nn.Linear(32, 32), torch.nn.Tanh(),
        torch.nn.Linear(32, 32), torch.nn.Tanh(),
        torch.nn.Linear(32, 4))


def main():
    steps, local_batch, lr = 3, 8, 0.1
    reference = make_model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    wrapped = autostage.Module(model, optimizer, partition_num=2, pipeline_num=2)
    rank, world = autostage.get_rank(), autostage.get_world_size()
    failures = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step)
        x = torch.randn(world * local_batch, 8, generator=g)
        y = torch.randn(world * local_batch, 4, generator=g)
        rows = slice(rank * local_batch, (rank + 1) * local_batch)

        ref_opt.zero_grad()
        ref_out = reference(x)
        torch.nn.functional.mse_loss(ref_out, y).backward()
        ref_opt.step()

        optimizer.zero_grad()
        out = wrapped(x[rows])
        if not allclose(out, ref_out[rows].detach(), rtol=1e-5, atol=1e-6):
            failures.append(f"step {step}: output rows differ by {(out - ref_out[rows]).abs().max()}")
        torch.nn.functional.mse_loss(out, y[rows]).backward()
        optimizer.step()

    local = {p.data_ptr() for p in wrapped.local_parameters()}
    # The planner may leave a rank without a stage (a feeder only) when replicas would not pay
    # for their allreduce; a rank in a stage must hold that stage's parameters.
    in_stage = any(rank in st["ranks"] for st in wrapped._impl.deployment_info()["stages"])
    if in_stage and not local:
        failures.append("no local parameters on a rank that runs a stage")
    if not in_stage and local:
        failures.append("parameters on a rank that runs no stage")
    if any(p.data_ptr() not in local for g in optimizer.param_groups for p in g["params"]):
        failures.append("optimizer still holds parameters of other stages")
    ref_params = dict(reference.named_parameters())
    checked = 0
    for name, p in model.named_parameters():
        if p.data_ptr() in local:
            checked += 1
            if not allclose(p, ref_params[name], rtol=1e-4, atol=1e-6):
                failures.append(f"parameter {name} differs by {(p - ref_params[name]).abs().max()}")
    # Every parameter, wherever it lives, through the gathered state.
    for name, value in wrapped.state_dict().items():
        if name in ref_params and not allclose(value, ref_params[name], rtol=1e-4, atol=1e-6):
            failures.append(f"gathered {name} differs by {(value - ref_params[name]).abs().max()}")
    # Plan reuse: a fresh module deployed from the saved plan computes what a fresh model does.
    path = os.path.join(tempfile.gettempdir(), f"autostage_check_{os.getpid()}.deployment")
    wrapped.save_deployment(path)
    reloaded = autostage.Module(make_model(), load_deployment=path)
    x = torch.randn(world * local_batch, 8, generator=torch.Generator().manual_seed(7))
    rows = slice(rank * local_batch, (rank + 1) * local_batch)
    expected = make_model()(x)[rows].detach()
    got = reloaded(x[rows]).detach()
    os.remove(path)
    if not allclose(got, expected, rtol=1e-5, atol=1e-6):
        failures.append(f"module from saved deployment differs by {(got - expected).abs().max()}")
    print(f"rank {rank}: checked {checked} local parameters over {steps} steps; "
          f"{len(failures)} failures", flush=True)
    finish(rank, failures)


if __name__ == "__main__":
    main()
