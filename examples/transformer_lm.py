"""A small transformer language model trained with autostage on synthetic token data.

    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 \\
        /usr/bin/python3 examples/transformer_lm.py [--layers 4] [--dim 128] [--mode train_step]

The model: token + position embedding, LAYERS pre-norm transformer layers (causal self-attention
+ GELU MLP; --kv-heads K < --heads: grouped-query attention, K and V of K heads each read by
heads / K query heads, as Llama's), a final LayerNorm and an LM head whose weight is tied to the
token embedding (--untied for a separate one).
Two ways to train:
  --mode forward     (default) out = model(tokens); cross_entropy(out, targets).backward():
                     autostage runs the pipeline forward, the loss is computed outside it.
  --mode train_step  the wrapped model returns the loss itself; model.train_step(tokens, targets)
                     runs forward, backward and gradient averaging with the plan's schedule (1F1B).
The data is synthetic: every sequence counts up from a random start modulo the vocabulary, so the
next token is predictable and the loss falls quickly.
"""
import argparse
import math
import sys

import torch


class CausalSelfAttention(torch.nn.Module):
    """Multi-head self-attention written batch-first throughout.

    Every intermediate keeps the batch in dim 0 and reshapes use fixed sizes (-1 for the batch), so
    autostage can cut a stage boundary anywhere in the layer (see "Writing models for pipeline
    cuts" in docs/guide.md about torch.nn.MultiheadAttention).
    """

    def __init__(self, dim, heads, seq, kv_heads=None, fused=False):
        super().__init__()
        self.heads, self.head_dim, self.seq = heads, dim // heads, seq
        self.kv_heads = kv_heads or heads
        self.fused = fused or self.kv_heads == heads
        if self.fused:  # one projection of Q, then K and V (Phi-3's layout where fewer)
            self.qkv = torch.nn.Linear(dim, dim + 2 * self.kv_heads * self.head_dim)
        else:  # grouped-query attention: K and V of fewer heads, each shared by a group of Q's
            self.q = torch.nn.Linear(dim, dim)
            self.k, self.v = (torch.nn.Linear(dim, self.kv_heads * self.head_dim) for _ in "kv")
        self.out = torch.nn.Linear(dim, dim)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1),
                             persistent=False)

    def split_heads(self, t, heads):  # -> [batch, heads, seq, dim]
        return t.reshape(-1, self.seq, heads, self.head_dim).transpose(1, 2)

    def repeat_kv(self, t):
        """[batch, kv_heads, seq, dim] -> [batch, heads, seq, dim], each K/V head repeated for its
        group of query heads (as transformers' repeat_kv)."""
        group = self.heads // self.kv_heads
        return t[:, :, None].expand(-1, self.kv_heads, group, self.seq, self.head_dim).reshape(
            -1, self.heads, self.seq, self.head_dim)

    def forward(self, x):
        if self.kv_heads == self.heads:
            q, k, v = (self.split_heads(t, self.heads) for t in self.qkv(x).chunk(3, dim=-1))
        elif self.fused:  # cut apart by slices
            qkv, width = self.qkv(x), self.heads * self.head_dim
            kv = self.kv_heads * self.head_dim
            q = self.split_heads(qkv[..., :width], self.heads)
            k, v = (self.repeat_kv(self.split_heads(t, self.kv_heads))
                    for t in (qkv[..., width:width + kv], qkv[..., width + kv:]))
        else:
            q = self.split_heads(self.q(x), self.heads)
            k, v = (self.repeat_kv(self.split_heads(t(x), self.kv_heads)) for t in (self.k, self.v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim) + self.mask
        context = torch.softmax(scores, dim=-1) @ v
        return self.out(context.transpose(1, 2).reshape(-1, self.seq, self.heads * self.head_dim))


class EncoderLayer(torch.nn.Module):
    """Pre-norm transformer layer: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, dim, heads, seq, kv_heads=None, fused=False):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attention = CausalSelfAttention(dim, heads, seq, kv_heads, fused)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CausalLM(torch.nn.Module):
    def __init__(self, vocab, dim, layers, heads, seq, tied=True, kv_heads=None, fused=False):
        super().__init__()
        self.token = torch.nn.Embedding(vocab, dim)
        torch.nn.init.normal_(self.token.weight, std=0.02)  # logits start near uniform
        self.position = torch.nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.layers = torch.nn.ModuleList([EncoderLayer(dim, heads, seq, kv_heads, fused)
                                           for _ in range(layers)])
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        if tied:
            self.head.weight = self.token.weight

    def forward(self, tokens):
        x = self.token(tokens) + self.position  # every batch has exactly `seq` tokens
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class LMWithLoss(torch.nn.Module):
    """The same model returning its mean next-token cross-entropy (for train_step)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, tokens, targets):
        return next_token_loss(self.lm(tokens), targets)


def next_token_loss(logits, targets):
    """Mean cross-entropy over every position. The logits [batch, seq, vocab] are transposed to
    [batch, vocab, seq] rather than flattened to [batch * seq, vocab], so every value keeps the
    batch in dim 0 (autostage splits boundary values along dim 0)."""
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets)


def synthetic_batch(batch, seq, vocab, generator):
    """Counting sequences: token t+1 = token t + 1 (mod vocab); targets = inputs shifted by one."""
    start = torch.randint(0, vocab, (batch, 1), generator=generator)
    ramp = (start + torch.arange(seq + 1)) % vocab
    return ramp[:, :-1].contiguous(), ramp[:, 1:].contiguous()


def parse_args(argv):
    p = argparse.ArgumentParser(description="Train a small causal transformer LM with autostage.")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank (default: 8)")
    p.add_argument("--seq", type=int, default=32, help="sequence length (default: 32)")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary size (default: 256)")
    p.add_argument("--dim", type=int, default=128, help="model width (default: 128)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default: 4)")
    p.add_argument("--kv-heads", type=int, default=0,
                   help="K/V heads, dividing --heads (default 0: as many as --heads)")
    p.add_argument("--layers", type=int, default=4, help="encoder layers (default: 4)")
    p.add_argument("--untied", action="store_true", help="separate LM head weight")
    p.add_argument("--mode", choices=["forward", "train_step"], default="forward")
    p.add_argument("--steps", type=int, default=5, help="training steps (default: 5)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default: 3e-3)")
    p.add_argument("--partition-num", type=int, default=0,
                   help="force this many stages (default 0: the planner chooses)")
    args = p.parse_args(argv)
    for name in ("batch", "seq", "vocab", "dim", "heads", "layers", "steps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.dim % args.heads:
        p.error(f"--dim ({args.dim}) must be a multiple of --heads ({args.heads})")
    if args.kv_heads < 0 or (args.kv_heads and args.heads % args.kv_heads):
        p.error(f"--kv-heads ({args.kv_heads}) must divide --heads ({args.heads})")
    return args


def main(argv):
    args = parse_args(argv)
    import autostage  # after argument checks: a usage error needs no MPI

    torch.manual_seed(0)  # the same initial model on every rank
    lm = CausalLM(args.vocab, args.dim, args.layers, args.heads, args.seq, tied=not args.untied,
                  kv_heads=args.kv_heads or None)
    model = lm if args.mode == "forward" else LMWithLoss(lm)
    rank = autostage.get_rank()
    if rank == 0:
        print(f"#Parameters={sum(p.numel() for p in model.parameters())}", flush=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    options = {"partition_num": args.partition_num} if args.partition_num else {}
    model = autostage.Module(model, optimizer, **options)

    generator = torch.Generator().manual_seed(1000 + rank)  # each rank's own data
    for step in range(args.steps):
        tokens, targets = synthetic_batch(args.batch, args.seq, args.vocab, generator)
        optimizer.zero_grad()
        if args.mode == "forward":
            loss = next_token_loss(model(tokens), targets)
            loss.backward()
        else:
            loss = model.train_step(tokens, targets)
        optimizer.step()
        value = float(loss)
        if rank == 0:
            print(f"step {step} loss {value:.6f}", flush=True)
        if not math.isfinite(value):
            raise RuntimeError(f"rank {rank} step {step}: the loss is not finite ({value})")
    autostage.barrier()
    if rank == 0:
        print("transformer_lm finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
