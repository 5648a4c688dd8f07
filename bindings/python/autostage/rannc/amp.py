"""``pyrannc.amp``: RaNNC's helpers for Apex AMP's fp32 master parameters, where they apply.

autostage does not run Apex (docs/rannc-migration.md): a model whose optimizer Apex did not
prepare trains in its parameters' dtype, so its master parameters are its parameters. These
helpers keep RaNNC's names and meaning for such a model, so scripts (and RaNNC's own tests) that
call them run unchanged. Mixed precision on autostage is the option ``precision`` (bf16, or fp16
with dynamic loss scaling).
"""
import torch

from .. import _autostage


def _apex_prepared(optimizer):
    """Whether Apex's ``amp.initialize`` prepared `optimizer` (it attaches ``_amp_stash``)."""
    return optimizer is not None and hasattr(optimizer, "_amp_stash")


def _refuse_apex(optimizer):
    if _apex_prepared(optimizer):
        raise _autostage.UnsupportedError(
            "pyrannc.amp: the optimizer was prepared by Apex (amp.initialize), which autostage "
            "does not run; drop amp.initialize and pass precision='fp16' or 'bf16' to the module")


def master_params(optimizer):
    """The optimizer's master parameters: without Apex, the parameters it steps."""
    _refuse_apex(optimizer)
    for group in optimizer.param_groups:
        yield from group["params"]


def named_master_params(model, optimizer, zero=False):
    """{name: master parameter} of `model` (RaNNC's signature): without Apex, the parameters."""
    _refuse_apex(optimizer)
    model = getattr(model, "module", model)  # a DistributedDataParallel reference
    return dict(model.named_parameters())


def allreduce_grads_rannc(rmodel, optimizer, prescale=1.0, use_amp_master_param=True):
    """Allreduces `rmodel`'s gradients after ``delay_grad_allreduce(True)`` (RaNNC's helper for
    Apex master gradients); returns whether the loss scale overflowed (never without Apex)."""
    _refuse_apex(optimizer)
    from . import allreduce_grads
    return allreduce_grads(rmodel, optimizer, prescale)


def allreduce_grads(optimizer, prescale=1.0):
    """RaNNC's allreduce of a plain (not RaNNC-wrapped) model's master gradients over every rank:
    each gradient becomes the sum over the ranks divided by `prescale` (pass the world size to
    average, as DDP does). Returns False (no loss-scale overflow without Apex). Collective: every
    rank passes an optimizer over the same parameters."""
    _refuse_apex(optimizer)
    with torch.no_grad():
        for p in master_params(optimizer):
            if p.grad is not None:
                gathered = _autostage._all_gather(p.grad.detach().contiguous())
                p.grad.copy_(torch.stack(gathered).sum(0) / prescale)
    return False
