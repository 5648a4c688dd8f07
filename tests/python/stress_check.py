"""Run under mpirun (see test_stress.py): STEPS training steps of the transformer example on
2 stages; RSS must not grow after warm-up and the losses must follow a plain single-process run."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import autostage  # noqa: E402
from mpi_launch import finish  # noqa: E402
from transformer_lm import CausalLM, next_token_loss, synthetic_batch  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, SEQ, LOCAL, LR = 64, 32, 2, 2, 16, 4, 1e-3
WARMUP = 20


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build():
    torch.manual_seed(77)
    return CausalLM(VOCAB, DIM, LAYERS, HEADS, SEQ)


def main():
    steps = int(sys.argv[1])
    rank, world = autostage.get_rank(), autostage.get_world_size()
    model, reference = build(), build()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=LR)
    wrapped = autostage.Module(model, optimizer, partition_num=2, pipeline_num=2,
                               schedule="gpipe", recompute="never")
    generator = torch.Generator().manual_seed(5)
    rows = slice(rank * LOCAL, (rank + 1) * LOCAL)
    worst, warm_rss = 0.0, None
    for step in range(steps):
        tokens, targets = synthetic_batch(world * LOCAL, SEQ, VOCAB, generator)
        ref_opt.zero_grad()
        ref_out = reference(tokens)
        # The plain model's loss on this rank's rows, before this step's update.
        ref_rows = next_token_loss(ref_out[rows].detach(), targets[rows]).item()
        next_token_loss(ref_out, targets).backward()
        ref_opt.step()
        optimizer.zero_grad()
        # Each rank's mean loss over its rows; gradients are averaged over ranks like DDP, which
        # equals the plain model's gradient of the global-batch mean.
        loss = next_token_loss(wrapped(tokens[rows]), targets[rows])
        loss.backward()
        optimizer.step()
        worst = max(worst, abs(loss.item() - ref_rows) / abs(ref_rows))
        if step + 1 == WARMUP:
            warm_rss = rss_bytes()
    growth = rss_bytes() - warm_rss
    print(f"rank {rank}: {steps} steps, rss after warm-up {warm_rss >> 20} MiB, growth "
          f"{growth / 2**20:.1f} MiB, worst relative loss gap {worst:.2e}", flush=True)
    failures = []
    if growth > 4 * 2**20:  # a leak of ~23 KB per step over 180 steps
        failures.append(f"RSS grew by {growth / 2**20:.1f} MiB after warm-up")
    if worst > 1e-5:
        failures.append(f"losses drifted from plain PyTorch by {worst:.2e} (relative)")
    finish(rank, failures)


if __name__ == "__main__":
    main()
