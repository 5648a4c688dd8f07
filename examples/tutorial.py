"""autostage tutorial: an MLP of LAYERS x (Linear(HIDDEN, HIDDEN) + ReLU), after RaNNC's tutorial.

    mpirun --allow-run-as-root --oversubscribe -np 4 -x OMP_NUM_THREADS=1 \\
        /usr/bin/python3 examples/tutorial.py 32 512 8 [--steps 4] [--mem-limit-gb 0.02] \\
        [--save-deployment plan.pb] [--trace-events DIR]

BATCH is the batch size per rank (like DistributedDataParallel): the global batch is
BATCH x number of ranks. Every rank builds the same model and feeds its own local batch; on the
first call autostage traces, profiles and plans the model (read the [Decomposer]/[DPStaging]
partition log), then the ordinary single-process loop trains it. Extra keyword options go to
autostage.Module: --mem-limit-gb (plan for this much memory per device), --partition-num (force a
stage count), or any config key as AUTOSTAGE_<KEY> in the environment. --save-deployment writes the
plan (rank 0) for `autostage show` / `autostage report`; --trace-events DIR writes each rank's
Chrome trace there (trace_events=true) for `autostage report --trace DIR`.

Memory: with the defaults (8 layers of 512) the model has 2.1 M parameters; weights, gradients and
Adam's two moments take 33.6 MB. With --mem-limit-gb 0.02 (19.3 MB usable after the 10% margin)
a single device cannot hold the whole model, so on 4 ranks the planner must cut it into stages;
scripts/demo shows it choosing 2 stages x 2 replicas.
"""
import argparse
import math
import sys

import torch

import autostage


class Net(torch.nn.Module):
    def __init__(self, hidden, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.Linear(hidden, hidden) for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Train an MLP of LAYERS x Linear(HIDDEN, HIDDEN)+ReLU with autostage.Module.")
    parser.add_argument("batch", metavar="BATCH", type=positive_int, nargs="?", default=32,
                        help="batch size per rank (default: 32)")
    parser.add_argument("hidden", metavar="HIDDEN", type=positive_int, nargs="?", default=512,
                        help="width of every layer (default: 512)")
    parser.add_argument("layers", metavar="LAYERS", type=positive_int, nargs="?", default=8,
                        help="number of Linear+ReLU layers (default: 8)")
    parser.add_argument("--steps", type=positive_int, default=4, help="training steps (default: 4)")
    parser.add_argument("--lr", type=positive_float, default=1e-3, help="Adam learning rate")
    parser.add_argument("--mem-limit-gb", type=positive_float, default=None,
                        help="device memory to plan for in GiB (default: the device's own)")
    parser.add_argument("--partition-num", type=positive_int, default=None,
                        help="force this many pipeline stages (default: the planner chooses)")
    parser.add_argument("--save-deployment", metavar="PATH", default=None,
                        help="after training, rank 0 saves the deployment (the plan) to PATH")
    parser.add_argument("--trace-events", metavar="DIR", default=None,
                        help="record each rank's forward/backward/communication events in DIR")
    return parser.parse_args(argv)


def module_options(args):
    options = {}
    if args.mem_limit_gb is not None:
        options["mem_limit_gb"] = args.mem_limit_gb
    if args.partition_num is not None:
        options["partition_num"] = args.partition_num
    if args.trace_events is not None:
        options["trace_events"] = True
        options["trace_events_dir"] = args.trace_events
    return options


def main(argv):
    args = parse_args(argv)
    torch.manual_seed(0)  # the same initial model on every rank
    model = Net(args.hidden, args.layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    rank, world = autostage.get_rank(), autostage.get_world_size()
    if rank == 0:
        count = sum(p.numel() for p in model.parameters())
        print(f"#Parameters={count}", flush=True)
        print(f"global batch {args.batch * world} = {args.batch} per rank x {world} ranks",
              flush=True)
    model = autostage.Module(model, optimizer, **module_options(args))

    generator = torch.Generator().manual_seed(1000 + rank)  # each rank's own data
    for step in range(args.steps):
        x = torch.randn(args.batch, args.hidden, generator=generator)
        target = torch.randn(args.batch, args.hidden, generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        value = loss.item()
        if rank == 0:
            print(f"step {step} loss {value:.6f} (rank 0's local batch)", flush=True)
        if not math.isfinite(value):
            raise RuntimeError(f"rank {rank} step {step}: the loss is not finite ({value})")
    if args.save_deployment is not None and rank == 0:
        model.save_deployment(args.save_deployment)
        print(f"deployment saved to {args.save_deployment}", flush=True)
    autostage.barrier()
    if rank == 0:
        print("tutorial finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
