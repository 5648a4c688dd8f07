"""A rank fails mid-step; run by test_bad_input.py under mpirun with 4 ranks.

--mode kill:  rank 3 SIGKILLs itself between forward and backward of step 2; the others must fail
              after comm_timeout_s naming rank 3 (uncaught, so autostage's hook aborts the job).
--mode raise: rank 2 feeds a token id outside the embedding table; the stage replica that embeds
              those rows raises (with its rank and stage), the error is not caught, and the hook
              ends the job with MPI_Abort.
--mode agreed: rank 1 passes its input by keyword, rank 0 by position, and nobody catches the error;
              every rank raises it and exits normally with status 1 (no MPI_Abort).
"""
import argparse
import os
import signal
import time

import torch

import autostage


class TokenNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, tokens):
        return self.b(torch.tanh(self.a(self.embed(tokens).mean(1))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["kill", "raise", "agreed"], required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TokenNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    m = autostage.Module(model, optimizer, partition_num=2)
    rank = autostage.get_rank()
    if args.mode == "agreed":
        tokens = torch.zeros(8, 5, dtype=torch.long)
        m(tokens=tokens) if rank == 1 else m(tokens)
    for step in range(3):
        tokens = torch.randint(0, 10, (8, 5), generator=torch.Generator().manual_seed(step))
        if args.mode == "raise" and step == 1 and rank == 2:
            tokens[0, 0] = 999
        optimizer.zero_grad()
        out = m(tokens)
        if args.mode == "kill" and step == 1 and rank == 3:
            print(f"KILL rank 3 at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        out.pow(2).mean().backward()
        optimizer.step()
        print(f"rank {rank}: step {step} done", flush=True)
    print(f"rank {rank}: UNEXPECTED normal end", flush=True)


if __name__ == "__main__":
    main()
