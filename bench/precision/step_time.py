"""Step time and planned memory, fp32 vs precision="bf16", on the tutorial model (LAYERS x
Linear(HIDDEN, HIDDEN) + ReLU). Prints figures; never passes or fails.

    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x PYTHONPATH \\
        /usr/bin/python3 bench/precision/step_time.py [--hidden 512] [--layers 8] [--batch 32]

Both precisions are planned with the same forced stage count and micro-batches (so the step
times compare the same pipeline); the planner's per-stage memory is in the [DPStaging] lines
(total_mem=..., cast=... is the autocast weight-copy term). Each precision runs warm-up steps,
then the timed ones, alternating precisions to spread the machine's load drift evenly.
"""
import argparse
import statistics
import time

import torch

import autostage


class Net(torch.nn.Module):
    def __init__(self, hidden, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(hidden, hidden) for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--micro-batches", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank, world = autostage.get_rank(), autostage.get_world_size()
    x = torch.randn(args.batch, args.hidden)
    y = torch.randn(args.batch, args.hidden)
    runs = {}

    def step(precision):
        wrapped, optimizer, _ = runs[precision]
        optimizer.zero_grad()
        start = time.perf_counter()
        torch.nn.functional.mse_loss(wrapped(x).float(), y).backward()
        optimizer.step()
        autostage.barrier()
        return time.perf_counter() - start

    # Options are global and read when a module deploys: deploy (trace, profile, plan) and warm
    # up each module before creating the next.
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = Net(args.hidden, args.layers)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        wrapped = autostage.Module(model, optimizer, precision=precision, partition_num=world,
                                   pipeline_num=args.micro_batches, schedule="1f1b",
                                   recompute="never")
        runs[precision] = (wrapped, optimizer, [])
        for _ in range(2):
            step(precision)
    for _ in range(args.steps):
        for precision in runs:
            runs[precision][2].append(step(precision))
    if rank == 0:
        fp32 = statistics.median(runs["fp32"][2])
        bf16 = statistics.median(runs["bf16"][2])
        print(f"step time (median of {args.steps}, {world} ranks, batch {args.batch}/rank, "
              f"{args.layers}x{args.hidden}): fp32 {fp32 * 1e3:.1f} ms, bf16 {bf16 * 1e3:.1f} ms, "
              f"bf16/fp32 {bf16 / fp32:.2f}", flush=True)
    autostage.barrier()


if __name__ == "__main__":
    main()
