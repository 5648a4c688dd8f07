"""Run under mpirun (see test_planner_service.py): one deployment with planner_address=argv[1];
the output must equal plain PyTorch whether the service planned, answered from its store, or was
not there (the job then plans locally)."""
import sys

import torch

import autostage


def make_model():
    torch.manual_seed(23)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 2))


def main():
    rank, world = autostage.get_rank(), autostage.get_world_size()
    wrapped = autostage.Module(make_model(), planner_address=sys.argv[1], planner_timeout_s=20,
                               partition_num=min(2, world))
    x = torch.randn(4 * world, 5, generator=torch.Generator().manual_seed(4))
    rows = slice(4 * rank, 4 * rank + 4)
    out = wrapped(x[rows]).detach()
    expected = make_model()(x)[rows].detach()
    ok = torch.allclose(out, expected, rtol=1e-5, atol=1e-6)
    print(f"rank {rank}: planner service run {'ok' if ok else 'FAIL'}", flush=True)
    autostage.barrier()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
