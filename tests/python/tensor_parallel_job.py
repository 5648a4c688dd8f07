"""Run under mpirun (see test_tensor_parallel.py): a job asking for tensor parallelism. The
runtime runs stages of one rank per replica only, so tensor_parallel=2 is a ConfigError on every
rank naming the option, and tensor_parallel=auto says so in the log and trains as plain PyTorch
does: outputs and parameters after one SGD step (rtol 1e-6). Phase: `forced` or `auto`."""
import sys

import torch

import autostage
from mpi_launch import finish

phase = sys.argv[1]
rank, world = autostage.get_rank(), autostage.get_world_size()
failures = []
torch.manual_seed(3)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
reference.load_state_dict(model.state_dict())
x = torch.randn(4 * world, 8, generator=torch.Generator().manual_seed(5))
local = x[4 * rank:4 * (rank + 1)]
if phase == "forced":
    wrapped = autostage.Module(model, tensor_parallel=2)
    try:
        wrapped(local)
        failures.append("tensor_parallel=2 trained")
    except autostage.ConfigError as e:
        if "tensor_parallel=2" not in str(e) or "runtime does not run" not in str(e):
            failures.append(f"unclear error: {e}")
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = autostage.Module(model, optimizer, tensor_parallel="auto")
    out = wrapped(local)
    out.sum().backward()
    optimizer.step()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    expected = reference(x)
    # The ranks' gradients are averaged, as DistributedDataParallel does.
    (expected.sum() / world).backward()
    ref_optimizer.step()
    if not torch.allclose(out, expected[4 * rank:4 * (rank + 1)], rtol=1e-6, atol=1e-7):
        failures.append("outputs differ from plain PyTorch")
    state = wrapped.state_dict()  # gathered from the stages' ranks
    for key, want in reference.state_dict().items():
        got = [v for k, v in state.items() if k == key or k.endswith("." + key)]
        if len(got) != 1 or not torch.allclose(got[0], want, rtol=1e-6, atol=1e-7):
            failures.append(f"{key} after one SGD step differs from plain PyTorch")
print(f"rank {rank}: tensor_parallel {phase} checked; {len(failures)} failures", flush=True)
finish(rank, failures)
