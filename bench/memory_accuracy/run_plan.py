"""One configuration of bench/memory_accuracy (run under mpirun by memory_accuracy.py): trains a
model a few steps under a forced (or free) plan and prints, per rank, one line
`MEMORY_ACCURACY {json}` with the plan, the measured and predicted peak memory (Note [Measured
memory] in staging/memory_meter.h) and the measured and predicted step time, also written to
OUT/rank<r>.json with --out OUT (ranks' stdout lines can interleave)."""
import argparse
import json
import os
import statistics
import sys
import time

import torch

import autostage

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
sys.path.insert(0, EXAMPLES)


class WithLoss(torch.nn.Module):
    """`model` with its loss inside, for train_step."""

    def __init__(self, model, loss):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, x, target):
        return self.loss(self.model(x), target)


def tutorial(batch, generator):
    import tutorial as example
    model = example.Net(512, 8)
    x = torch.randn(batch, 512, generator=generator)
    return model, (x,), torch.randn(batch, 512, generator=generator), torch.nn.functional.mse_loss


def transformer(batch, generator):
    import transformer_lm as example
    model = example.CausalLM(vocab=256, dim=128, heads=4, layers=4, seq=32, tied=True)
    tokens, targets = example.synthetic_batch(batch, 32, 256, generator)
    return model, (tokens,), targets, example.next_token_loss


def transformer_gqa(batch, generator, fused=False):
    """The transformer with multi-query attention (4 Q heads, one K/V head): a tensor-parallel
    stage keeps K and V whole on every rank (Note [Whole K/V heads] in
    decomposer/tensor_parallel_split.h); `fused`: Q, K and V from one projection cut apart by
    slices, K's and V's rows of it whole on every rank (Note [Fused parts])."""
    import transformer_lm as example
    model = example.CausalLM(vocab=256, dim=128, heads=4, layers=4, seq=32, tied=True, kv_heads=1,
                             fused=fused)
    tokens, targets = example.synthetic_batch(batch, 32, 256, generator)
    return model, (tokens,), targets, example.next_token_loss


def transformer_gqa_fused(batch, generator):
    return transformer_gqa(batch, generator, fused=True)


def transformer_vocab(batch, generator, tied=False):
    """The transformer with a 16,384-token vocabulary and its own LM head: split over the
    vocabulary by a tensor-parallel stage, the embedding's rows too (Note [Vocabulary-parallel
    loss] in staging/tensor_parallel_ops.h); `tied`: the head shares the embedding's table."""
    import transformer_lm as example
    model = example.CausalLM(vocab=16384, dim=128, heads=4, layers=2, seq=32, tied=tied)
    tokens, targets = example.synthetic_batch(batch, 32, 16384, generator)
    return model, (tokens,), targets, example.next_token_loss


def transformer_vocab_tied(batch, generator):
    return transformer_vocab(batch, generator, tied=True)


def resnet18(batch, generator):
    import torchvision
    model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(batch, 3, 32, 32, generator=generator)
    y = torch.randint(0, 10, (batch,), generator=generator)
    return model, (x,), y, torch.nn.functional.cross_entropy


MODELS = {"tutorial": tutorial, "transformer": transformer, "transformer_gqa": transformer_gqa,
          "transformer_gqa_fused": transformer_gqa_fused,
          "transformer_vocab": transformer_vocab,
          "transformer_vocab_tied": transformer_vocab_tied, "resnet18": resnet18}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model", choices=sorted(MODELS))
    p.add_argument("--batch", type=int, default=16, help="samples per rank")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--style", choices=["forward", "train_step"], default="forward")
    p.add_argument("--out", help="directory for rank<r>.json")
    p.add_argument("options", nargs="*", help="autostage options as key=value")
    args = p.parse_intermixed_args()
    torch.manual_seed(0)
    rank = autostage.get_rank()
    generator = torch.Generator().manual_seed(rank)
    model, inputs, target, loss_fn = MODELS[args.model](args.batch, generator)
    if args.style == "train_step":
        model = WithLoss(model, loss_fn)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    options = dict(o.split("=", 1) for o in args.options)
    wrapped = autostage.Module(model, optimizer, **options)
    bf16 = options.get("precision") == "bf16"
    seconds = []
    for _ in range(args.steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        if args.style == "train_step":
            wrapped.train_step(*inputs, target)
        else:
            out = wrapped(*inputs)
            loss_fn(out.float() if bf16 else out, target).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    info = wrapped._impl.deployment_info()
    memory = wrapped._impl.last_step_memory()
    stage = memory["stage"] if memory else -1
    record = {
        "rank": rank, "memory": memory, "stages": len(info["stages"]),
        "replicas": [len(s["ranks"]) // s["tensor_parallel"] for s in info["stages"]],
        "tensor_parallel": [s["tensor_parallel"] for s in info["stages"]],
        "micro_batches": info["micro_batches"], "schedule": info["schedule"],
        "virtual_stages": info.get("virtual_stages", 1),
        "recompute": [s["recompute"] for s in info["stages"]],
        "zero": [s["zero"] for s in info["stages"]],
        "predicted_seconds": info["predicted_iteration_seconds"],
        "measured_seconds": statistics.median(seconds[2:] or seconds),
        "stage": stage,
    }
    print("MEMORY_ACCURACY " + json.dumps(record), flush=True)
    if args.out:
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    main()
