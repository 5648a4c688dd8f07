"""Run under mpirun (see test_export.py): a model whose batch size torch.export fixes (its code
turns the batch size into a Python int) trains with micro-batches of exactly the captured rows
(Note [Fixed micro-batch size]) and equals plain PyTorch: outputs and parameters after two SGD
steps (rtol 1e-5). Argument: partition_num (1: replicas only, 2: two stages, two micro-batches)."""
import sys

import torch

import autostage
from mpi_launch import finish

LOCAL = 4
partition = int(sys.argv[1])
rank, world = autostage.get_rank(), autostage.get_world_size()
failures = []


class IntBatch(torch.nn.Module):
    """int(x.shape[0]) is a guard torch.export can only satisfy by fixing the batch size."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 12)
        self.b = torch.nn.Linear(12, 12)
        self.c = torch.nn.Linear(12, 3)

    def forward(self, x):
        rows = int(x.shape[0])
        h = torch.tanh(self.a(x)).reshape(rows, 3, 4).transpose(1, 2).reshape(rows, 12)
        return self.c(torch.tanh(self.b(h)))


torch.manual_seed(11)
model, reference = IntBatch(), IntBatch()
reference.load_state_dict(model.state_dict())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
wrapped = autostage.Module(model, optimizer, partition_num=partition)
for step in range(2):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(LOCAL * world, 6, generator=g)
    out = wrapped(x[LOCAL * rank:LOCAL * (rank + 1)])
    out.sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    expected = reference(x)
    (expected.sum() / world).backward()  # the ranks' gradients are averaged, as DDP does
    ref_optimizer.step()
    ref_optimizer.zero_grad()
    if not torch.allclose(out, expected[LOCAL * rank:LOCAL * (rank + 1)], rtol=1e-5, atol=1e-6):
        failures.append(f"step {step}: outputs differ from plain PyTorch")
state = wrapped.state_dict()
for key, want in reference.state_dict().items():
    got = [v for k, v in state.items() if k == key or k.endswith("." + key)]
    if len(got) != 1 or not torch.allclose(got[0], want, rtol=1e-5, atol=1e-6):
        failures.append(f"{key} after two SGD steps differs from plain PyTorch")
print(f"rank {rank}: fixed batch partition_num={partition} checked; {len(failures)} failures",
      flush=True)
finish(rank, failures)
