"""Runtime overhead of autostage.Module on the transformer example model (prints, never fails).

    single rank:  /usr/bin/python3 bench/runtime_overhead/overhead.py single
    two ranks:    mpirun -np 2 ... /usr/bin/python3 bench/runtime_overhead/overhead.py ddp
(bench/runtime_overhead/run does both.)

single: one training step (zero_grad, forward, cross-entropy, backward, Adam step) of the plain
        model vs the same step through autostage.Module (one stage, one rank).
ddp:    on 2 ranks, autostage with partition_num=1 (pure data parallel: every rank holds the whole
        model, gradients averaged) vs torch.nn.parallel.DistributedDataParallel over gloo; same
        model, same per-rank batch.
The two variants run side by side in one process and alternate step by step, so load from other
processes on the machine hits both alike; warm-up steps are excluded; figures are medians.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from transformer_lm import CausalLM, next_token_loss, synthetic_batch  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["single", "ddp"])
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant (default: 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank (default: 8)")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--json", action="store_true", help="also print one JSON line of the figures")
    return p.parse_args(argv)


def make_model(args):
    torch.manual_seed(0)
    return CausalLM(args.vocab, args.dim, args.layers, args.heads, args.seq)


class Variant:
    """A model, its optimizer and its step times."""

    def __init__(self, name, model, optimizer):
        self.name, self.model, self.optimizer, self.times = name, model, optimizer, []

    def step(self, tokens, targets, timed, barrier):
        barrier()
        start = time.perf_counter()
        self.optimizer.zero_grad()
        loss = next_token_loss(self.model(tokens), targets)
        loss.backward()
        self.optimizer.step()
        elapsed = time.perf_counter() - start
        if timed:
            self.times.append(elapsed)
        return loss.item()


def run_side_by_side(variants, args, rank, barrier):
    generator = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.warmup + args.steps):
        tokens, targets = synthetic_batch(args.batch, args.seq, args.vocab, generator)
        order = variants if step % 2 == 0 else variants[::-1]  # neither always goes first
        for variant in order:
            variant.step(tokens, targets, timed=step >= args.warmup, barrier=barrier)


def report(title, baseline, candidate, target, args, world):
    base = statistics.median(baseline.times) * 1e3
    cand = statistics.median(candidate.times) * 1e3
    ratio = cand / base
    # Steps i of both variants ran back to back: the median of their ratios is less sensitive to
    # load that drifts over the run than the ratio of medians.
    paired = statistics.median(c / b for c, b in zip(candidate.times, baseline.times))
    verdict = "meets" if ratio <= target else "misses"
    print(f"{title}: {baseline.name} median {base:.2f} ms, {candidate.name} median {cand:.2f} ms "
          f"over {len(candidate.times)} steps (warm-up {args.warmup} excluded); "
          f"ratio {ratio:.3f} ({verdict} target <= {target:.2f}); "
          f"median of paired step ratios {paired:.3f}", flush=True)
    if args.json:
        print(json.dumps({"benchmark": title, "baseline": baseline.name, "baseline_ms": base,
                          "candidate": candidate.name, "candidate_ms": cand, "ratio": ratio,
                          "paired_ratio": paired, "target": target,
                          "steps": len(candidate.times), "ranks": world,
                          "batch_per_rank": args.batch, "layers": args.layers, "dim": args.dim,
                          "seq": args.seq}), flush=True)


def single(args):
    import autostage

    plain = make_model(args)
    wrapped_model = make_model(args)
    wrapped_opt = torch.optim.Adam(wrapped_model.parameters(), lr=1e-3)
    variants = [Variant("plain PyTorch", plain, torch.optim.Adam(plain.parameters(), lr=1e-3)),
                Variant("autostage.Module", autostage.Module(wrapped_model, wrapped_opt),
                        wrapped_opt)]
    run_side_by_side(variants, args, rank=0, barrier=lambda: None)
    report("single rank step", variants[0], variants[1], 1.05, args, world=1)


def init_gloo(rank, world):
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return dist


def ddp(args):
    import autostage

    rank, world = autostage.get_rank(), autostage.get_world_size()
    dist = init_gloo(rank, world)
    ddp_model = torch.nn.parallel.DistributedDataParallel(make_model(args))
    wrapped_model = make_model(args)
    wrapped_opt = torch.optim.Adam(wrapped_model.parameters(), lr=1e-3)
    variants = [
        Variant("DDP (gloo)", ddp_model, torch.optim.Adam(ddp_model.parameters(), lr=1e-3)),
        Variant("autostage.Module partition_num=1",
                autostage.Module(wrapped_model, wrapped_opt, partition_num=1), wrapped_opt)]
    run_side_by_side(variants, args, rank, barrier=dist.barrier)
    if rank == 0:
        report(f"{world}-rank data-parallel step", variants[0], variants[1], 1.0, args, world)
    dist.barrier()
    dist.destroy_process_group()


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    single(args) if args.mode == "single" else ddp(args)


if __name__ == "__main__":
    main(sys.argv[1:])
