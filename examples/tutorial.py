"""autostage tutorial: train a small transformer-style model across MPI ranks.

    mpirun --allow-run-as-root --oversubscribe -np 4 -x OMP_NUM_THREADS=1 \
        /usr/bin/python3 examples/tutorial.py

Every rank builds the same model and feeds its own local batch; autostage traces, profiles and
plans on the first call (read the [Decomposer]/[DPStaging] partition log), then the ordinary
single-process loop trains it. partition_num=2 asks for two pipeline stages.
"""
import torch

import autostage


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 4 * width)
        self.fc2 = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self, width=64, depth=4, classes=10):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(x))


def main():
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model = autostage.Module(model, optimizer, partition_num=2)
    rank, world = autostage.get_rank(), autostage.get_world_size()

    local_batch = 16
    generator = torch.Generator().manual_seed(1)  # the same global batch on every rank
    x = torch.randn(world * local_batch, 64, generator=generator)
    y = torch.randint(0, 10, (world * local_batch,), generator=generator)
    rows = slice(rank * local_batch, (rank + 1) * local_batch)  # this rank's share
    for step in range(8):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
        print(f"[rank{rank}] step {step} local loss {loss.item():.4f}", flush=True)
    autostage.barrier()
    if rank == 0:
        print("tutorial finished", flush=True)


if __name__ == "__main__":
    main()
