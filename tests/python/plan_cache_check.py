"""Run under mpirun (see test_plan_cache.py): one deployment with plan_cache_dir=argv[1]; the
output must equal plain PyTorch whether the plan was made or loaded from the cache."""
import sys

import torch

import autostage


def make_model():
    torch.manual_seed(21)
    return torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.ReLU(), torch.nn.Linear(12, 12),
                               torch.nn.ReLU(), torch.nn.Linear(12, 2))


def main():
    rank, world = autostage.get_rank(), autostage.get_world_size()
    wrapped = autostage.Module(make_model(), plan_cache_dir=sys.argv[1],
                               partition_num=min(2, world))
    x = torch.randn(4 * world, 5, generator=torch.Generator().manual_seed(3))
    rows = slice(4 * rank, 4 * rank + 4)
    out = wrapped(x[rows]).detach()
    expected = make_model()(x)[rows].detach()
    ok = torch.allclose(out, expected, rtol=1e-5, atol=1e-6)
    print(f"rank {rank}: plan cache run {'ok' if ok else 'FAIL'}", flush=True)
    autostage.barrier()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
