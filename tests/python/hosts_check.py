"""Run under mpirun by test_hosts.py, on simulated hosts (netns_hosts.py) or on one. Modes:

train STEPS   STEPS SGD steps of a fixed model on fixed data; every rank prints
              `LOSS <step> rank <r>: <value>` and, at the end, `DONE rank <r> on <host>`.
              --resume PATH first loads the checkpoint PATH (autostage.load_checkpoint) and
              prints `RESUMED rank <r> on <host>` (the job a lost host leaves behind, on fewer
              ranks).
run           trains until the job fails: every rank prints `STEP <s> rank <r> on <host> at <t>`
              after each step (the test injects its fault after step 1) and, when a step fails,
              `NOTICED rank <r> at <t>: <error>`, then re-raises (autostage's hook ends the job).
              These lines (and LOSS, DONE, RESUMED) also go to HOSTS_CHECK_DIR/rank<r>.log: a
              rank cut off from mpirun cannot send its output there (the folder is shared, as
              a home folder on NFS is).
              --checkpoint PATH saves the model there after step 1, before that step's line.
              With --fault the fault is made here by rank --fault-rank after step 1:
              stop  the rank stops itself with SIGSTOP (alive, silent);
              oom   the rank waits until the test has moved it into the memory cgroup named
                    HOSTS_CHECK_CGROUP (with a small limit), then allocates until the kernel's
                    OOM killer kills it; without a cgroup it SIGKILLs itself ("simulated").
"""
import argparse
import os
import re
import signal
import socket
import time

import torch

import autostage

LOCAL = 8


def make(width):
    torch.manual_seed(3)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def batch(step, rank, width):
    return torch.randn(LOCAL, width, generator=torch.Generator().manual_seed(1000 * step + rank))


def note(rank, line):
    print(line, flush=True)
    folder = os.environ.get("HOSTS_CHECK_DIR")
    if folder:
        with open(os.path.join(folder, f"rank{rank}.log"), "a") as f:
            f.write(line + "\n")


def out_of_memory(rank):
    cgroup = os.environ.get("HOSTS_CHECK_CGROUP")
    if not cgroup:
        note(rank, f"OOM rank {rank} simulated (SIGKILL) at {time.time():.3f}")
        os.kill(os.getpid(), signal.SIGKILL)
    # `ip netns exec` hides /sys/fs/cgroup (it mounts the namespace's own /sys): the test moves
    # this process into the cgroup; /proc/self/cgroup shows when.
    note(rank, f"OOM rank {rank} pid {os.getpid()} waits to be moved into cgroup {cgroup}")
    deadline = time.time() + 120
    while time.time() < deadline:
        with open("/proc/self/cgroup") as f:
            if re.search(rf"/{cgroup}$", f.read(), re.M):
                break
        time.sleep(0.05)
    note(rank, f"OOM rank {rank} in cgroup {cgroup}, allocating at {time.time():.3f}")
    hoard = []
    while True:  # touched pages: charged to the cgroup until the OOM killer ends the process
        hoard.append(bytearray(b"\1" * (16 << 20)))


def fault(kind, rank):
    note(rank, f"FAULT {kind} rank {rank} at {time.time():.3f}")
    if kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        out_of_memory(rank)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "run"])
    parser.add_argument("steps", type=int, nargs="?", default=3)
    parser.add_argument("--fault", choices=["stop", "oom"])
    parser.add_argument("--fault-rank", type=int, default=3)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--checkpoint")
    parser.add_argument("--resume")
    args = parser.parse_args()
    model = make(args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    wrapped = autostage.Module(model, optimizer)
    rank, host = autostage.get_rank(), socket.gethostname()
    if args.resume:
        autostage.load_checkpoint(args.resume, wrapped)
        note(rank, f"RESUMED rank {rank} on {host}")
    steps = args.steps if args.mode == "train" else 10000
    for step in range(steps):
        try:
            optimizer.zero_grad()
            loss = wrapped(batch(step, rank, args.width)).pow(2).mean()
            loss.backward()
            optimizer.step()
        except Exception as error:
            note(rank, f"NOTICED rank {rank} at {time.time():.3f}: {error}")
            raise
        if args.checkpoint and step == 1:
            autostage.save_checkpoint(wrapped, args.checkpoint)  # collective; rank 0 writes
        if args.mode == "train":
            note(rank, f"LOSS {step} rank {rank}: {loss.item():.9g}")
            continue
        note(rank, f"STEP {step} rank {rank} on {host} at {time.time():.3f}")
        if args.fault and step == 1 and rank == args.fault_rank:
            fault(args.fault, rank)
        time.sleep(0.3)  # a slow step: the job is still running when the test injects
    note(rank, f"DONE rank {rank} on {host}")


if __name__ == "__main__":
    main()
