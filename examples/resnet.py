"""torchvision ResNet trained with autostage on synthetic images.

    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 \\
        /usr/bin/python3 examples/resnet.py [--arch resnet18] [--image-size 32] [--batch 8]

Every rank builds the same torchvision model (random initialisation, no download) and feeds its
own batch of random images with random labels; autostage traces, profiles and plans it on the
first call. BatchNorm statistics are per replica micro-batch, as with DistributedDataParallel.
"""
import argparse
import math
import sys

import torch


def parse_args(argv):
    p = argparse.ArgumentParser(description="Train a torchvision ResNet with autostage.")
    p.add_argument("--arch", default="resnet18",
                   help="torchvision.models constructor: resnet18 (default), resnet50, ...")
    p.add_argument("--batch", type=int, default=8, help="images per rank (default: 8)")
    p.add_argument("--image-size", type=int, default=32,
                   help="image height and width (default: 32)")
    p.add_argument("--classes", type=int, default=10, help="number of classes (default: 10)")
    p.add_argument("--steps", type=int, default=3, help="training steps (default: 3)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default: 0.01)")
    p.add_argument("--partition-num", type=int, default=0,
                   help="force this many stages (default 0: the planner chooses)")
    args = p.parse_args(argv)
    for name in ("batch", "image_size", "classes", "steps"):
        if getattr(args, name) <= 0:
            flag = "--" + name.replace("_", "-")
            p.error(f"{flag} must be a positive integer, got {getattr(args, name)}")
    if args.batch < 2:
        p.error("--batch must be at least 2: BatchNorm needs more than one value per channel")
    return args


def build_model(arch, classes):
    import torchvision

    constructor = getattr(torchvision.models, arch, None)
    if constructor is None or not arch.startswith(("resnet", "wide_resnet", "resnext")):
        raise SystemExit(f"--arch: expected a torchvision ResNet such as resnet18, got {arch!r}")
    return constructor(num_classes=classes)  # weights=None: random initialisation, no download


def main(argv):
    args = parse_args(argv)
    import autostage  # after argument checks: a usage error needs no MPI

    torch.manual_seed(0)  # the same initial model on every rank
    model = build_model(args.arch, args.classes)
    rank = autostage.get_rank()
    if rank == 0:
        print(f"#Parameters={sum(p.numel() for p in model.parameters())}", flush=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    options = {"partition_num": args.partition_num} if args.partition_num else {}
    model = autostage.Module(model, optimizer, opt_param_factor=1, **options)  # SGD momentum

    generator = torch.Generator().manual_seed(1000 + rank)  # each rank's own data
    for step in range(args.steps):
        images = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=generator)
        labels = torch.randint(0, args.classes, (args.batch,), generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        value = loss.item()
        if rank == 0:
            print(f"step {step} loss {value:.6f} (rank 0's local batch)", flush=True)
        if not math.isfinite(value):
            raise RuntimeError(f"rank {rank} step {step}: the loss is not finite ({value})")
    autostage.barrier()
    if rank == 0:
        print("resnet finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
