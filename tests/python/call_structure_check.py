"""Keyword arguments and structured outputs on 2 ranks (2 stages, 2 micro-batches), against the
same model in one plain process; run by test_call_structure.py.

Steps, on one autostage.Module with allow_replan=true: a training call with tensors and a flag
by keyword returning {"loss", "logits"} (loss.backward()); an eval call without labels (another
trace: the dict has no loss); training again with another constant (scale=2.0: a replan), where
backward starts from the logits, not the loss; return_dict=False (a tuple). Prints
`rank R: ok <step>` or `rank R: FAIL <step>: <what>`.
"""
import collections
import os
import sys

import torch
import torch.nn.functional as F

import autostage

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_launch import finish  # noqa: E402

LOCAL = 4


class KeywordModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(6, 12)
        self.mid = torch.nn.Linear(12, 12)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, x, mask=None, scale=1.0, labels=None, return_dict=True):
        h = torch.tanh(self.embed(x))
        if mask is not None:
            h = h * mask
        h = torch.tanh(self.mid(h)) * scale
        logits = self.head(h)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        if not return_dict:
            return (logits, loss) if loss is not None else (logits,)
        out = collections.OrderedDict(logits=logits)
        if loss is not None:
            out["loss"] = loss
        return out


def main():
    rank, world = autostage.get_rank(), autostage.get_world_size()
    torch.manual_seed(0)
    model, reference = KeywordModel(), KeywordModel()
    reference.load_state_dict(model.state_dict())
    wrapped = autostage.Module(model, partition_num=2, pipeline_num=2, allow_replan=True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(world * LOCAL, 6, generator=g)
    mask = (torch.rand(world * LOCAL, 12, generator=g) > 0.2).float()
    labels = torch.randint(0, 3, (world * LOCAL,), generator=g)
    rows = slice(rank * LOCAL, (rank + 1) * LOCAL)
    failures = []

    def check(step, got, want):
        if type(got) is not type(want):
            failures.append(f"{step}: {type(got).__name__} vs {type(want).__name__}")
            return
        pairs = list(zip(got.values(), want.values())) if isinstance(got, dict) else \
            list(zip(got, want))
        if isinstance(got, dict) and list(got) != list(want):
            failures.append(f"{step}: keys {list(got)} vs {list(want)}")
        for a, b in pairs:
            b = b[rows] if b.dim() > 0 else b
            if not torch.allclose(a.detach(), b.detach(), rtol=1e-5, atol=1e-6):
                failures.append(f"{step}: output differs by {(a - b).abs().max():.3g}")
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            if p.grad is not None and not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6):
                failures.append(f"{step}: grad {name} differs")
        print(f"rank {rank}: {'FAIL' if failures else 'ok'} {step}", flush=True)

    def zero():
        for net in (model, reference):
            net.zero_grad(set_to_none=True)

    zero()
    out = wrapped(x[rows], mask=mask[rows], labels=labels[rows], return_dict=True)
    ref = reference(x, mask=mask, labels=labels, return_dict=True)
    out["loss"].backward()
    ref["loss"].backward()
    check("train dict with loss", out, ref)

    model.eval()
    reference.eval()
    with torch.no_grad():
        check("eval without labels", wrapped(x[rows], mask=mask[rows]),
              reference(x, mask=mask))
    model.train()
    reference.train()

    zero()
    out = wrapped(x[rows], mask=mask[rows], scale=2.0, labels=labels[rows], return_dict=True)
    ref = reference(x, mask=mask, scale=2.0, labels=labels, return_dict=True)
    out["logits"].pow(2).mean().backward()  # backward from an element that is not the loss
    ref["logits"].pow(2).mean().backward()  # gradients average over ranks, as in DDP
    check("replanned for scale=2.0, backward from logits", out, ref)
    if wrapped._impl.deployment_count != 1 or "scale=2.0" not in wrapped._traced_calls[True]:
        failures.append("scale=2.0 did not retrace and replan the training deployment")

    zero()
    out = wrapped(x[rows], mask=mask[rows], scale=2.0, labels=labels[rows], return_dict=False)
    ref = reference(x, mask=mask, scale=2.0, labels=labels, return_dict=False)
    out[1].backward()
    ref[1].backward()
    check("return_dict=False: a tuple", out, ref)
    finish(rank, failures)


if __name__ == "__main__":
    main()
