"""GPU step time of autostage.Module(partition_num=1) vs plain PyTorch on one GPU, and the time
its first call takes to trace, profile, plan and deploy (prints figures; never fails on time).

    bench/gpu_step/run [--steps N] [--batch B] [--layers L] [--json] ...
    python3 bench/gpu_step/gpu_step.py ...       (with build-gpu/python on PYTHONPATH)

The model is the transformer example (examples/transformer_lm.py). Both variants train a copy of
it with Adam on the same GPU: the plain model moved there with .cuda(), the wrapped one through
autostage.Module(model, optimizer, partition_num=1, device="cuda") (--model-device cpu hands it
the CPU model instead, for autostage to move). Each step is zero_grad, forward, cross-entropy,
backward, optimizer step, timed with the GPU synchronized before and after. The variants
alternate step by step (neither always goes first); warm-up steps are excluded; figures are
medians. The wrapped variant's first call is timed on its own: tracing, profiling, planning and
deployment plus one step (setup = first call - median step). Needs a GPU and an autostage built
with -DAUTOSTAGE_WITH_CUDA=ON (scripts/test-gpu builds one); exits with status 2 and says so
otherwise.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

TARGET = 1.05  # issue 14: autostage's one-stage step within 5% of plain PyTorch's


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="timed steps per variant (default: 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default: 5)")
    p.add_argument("--batch", type=int, default=32, help="sequences per step (default: 32)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--model-device", choices=["cuda", "cpu"], default="cuda",
                   help="where the model is when autostage.Module gets it (default: cuda)")
    p.add_argument("--json", action="store_true", help="also print one JSON line of the figures")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return args


def require_gpu(torch):
    """Exits with status 2 and a message when there is no GPU to run on."""
    if torch.cuda.is_available():
        return
    print(f"bench/gpu_step: no GPU visible (torch {torch.__version__}, CUDA {torch.version.cuda}: "
          "torch.cuda.is_available() is False); run it on a machine with an NVIDIA GPU and a "
          "CUDA build of PyTorch, with autostage built by scripts/test-gpu "
          "(-DAUTOSTAGE_WITH_CUDA=ON)", file=sys.stderr)
    sys.exit(2)


class Variant:
    """A model, its optimizer and its step times."""

    def __init__(self, name, model, optimizer):
        self.name, self.model, self.optimizer, self.times = name, model, optimizer, []

    def step(self, torch, loss_fn, tokens, targets):
        torch.cuda.synchronize()
        start = time.perf_counter()
        self.optimizer.zero_grad()
        loss = loss_fn(self.model(tokens), targets)
        loss.backward()
        self.optimizer.step()
        torch.cuda.synchronize()
        return time.perf_counter() - start


def main(argv):
    args = parse_args(argv)
    import torch

    require_gpu(torch)
    import autostage
    from transformer_lm import CausalLM, next_token_loss, synthetic_batch

    gpu = torch.device("cuda", 0)

    def make_model():
        torch.manual_seed(0)
        return CausalLM(args.vocab, args.dim, args.layers, args.heads, args.seq)

    plain_model = make_model().to(gpu)
    plain = Variant("plain PyTorch", plain_model,
                    torch.optim.Adam(plain_model.parameters(), lr=1e-3))
    wrapped_model = make_model().to(gpu if args.model_device == "cuda" else "cpu")
    wrapped_opt = torch.optim.Adam(wrapped_model.parameters(), lr=1e-3)
    wrapped = Variant("autostage.Module partition_num=1",
                      autostage.Module(wrapped_model, wrapped_opt, partition_num=1,
                                       device="cuda"),
                      wrapped_opt)

    generator = torch.Generator().manual_seed(1000)

    def batch():
        tokens, targets = synthetic_batch(args.batch, args.seq, args.vocab, generator)
        return tokens.to(gpu), targets.to(gpu)

    # The first call traces, profiles, plans and deploys, then steps.
    first = wrapped.step(torch, next_token_loss, *batch())
    for step in range(args.warmup + args.steps):
        tokens, targets = batch()
        order = (plain, wrapped) if step % 2 == 0 else (wrapped, plain)
        for variant in order:
            seconds = variant.step(torch, next_token_loss, tokens, targets)
            if step >= args.warmup:
                variant.times.append(seconds)
    report(args, torch, plain, wrapped, first)


def report(args, torch, plain, wrapped, first):
    base = statistics.median(plain.times) * 1e3
    cand = statistics.median(wrapped.times) * 1e3
    ratio = cand / base
    # Steps i of both variants ran back to back: the median of their ratios is less sensitive to
    # drifting load than the ratio of medians.
    paired = statistics.median(w / p for w, p in zip(wrapped.times, plain.times))
    verdict = "meets" if ratio <= TARGET else "misses"
    setup = first - cand / 1e3
    device = torch.cuda.get_device_name(0)
    print(f"one-GPU step ({device}, torch {torch.__version__}): {plain.name} median {base:.2f} ms, "
          f"{wrapped.name} median {cand:.2f} ms over {len(wrapped.times)} steps (warm-up "
          f"{args.warmup} excluded); ratio {ratio:.3f} ({verdict} target <= {TARGET:.2f}); "
          f"median of paired step ratios {paired:.3f}", flush=True)
    print(f"first call (trace + profile + plan + deploy + one step): {first:.2f} s; "
          f"setup without the step about {setup:.2f} s", flush=True)
    if args.json:
        print(json.dumps({"benchmark": "gpu_step", "device": device, "torch": torch.__version__,
                          "baseline": plain.name, "baseline_ms": base, "candidate": wrapped.name,
                          "candidate_ms": cand, "ratio": ratio, "paired_ratio": paired,
                          "target": TARGET, "first_call_s": first, "setup_s": setup,
                          "steps": len(wrapped.times), "batch": args.batch,
                          "layers": args.layers, "dim": args.dim, "seq": args.seq,
                          "model_device": args.model_device}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
