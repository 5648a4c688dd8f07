"""The test logic of RaNNC's suite (nict-wisdom/rannc, test/common.py), ported to the CPU.

``run`` trains a model two ways on every rank, on the same data: the reference is the traced
model under torch's DistributedDataParallel (gloo), the subject is the same model wrapped in
``pyrannc.RaNNCModule`` (here ``autostage.rannc``). It checks, as RaNNC's does, the parameters
before training, every step's outputs, gradients (after ``clip_grad_norm``) and parameters, then
the checkpoint: the model's ``state_dict`` loaded into a fresh copy wrapped again (with
``enable_apex_amp=True`` on an optimizer Apex never prepared, as RaNNC's script does), and the
optimizer's global ``state_dict(from_global=True)`` against the reference optimizer's, loaded
back with ``from_global=True``.

Differences from RaNNC's: no CUDA or Apex; models and data in float64 by default with tight
tolerances (rtol 1e-9, atol 1e-10; RaNNC's float32 rtol 1e-2 / 1e-1): autostage computes what plain PyTorch
computes, and in float32 Adam's first steps turn gradients that are rounding noise (a two-feature
layer norm's input gradient, a bias before BatchNorm) into updates of +-lr whose sign is the
noise's, so float32 parameters could only be compared loosely. A bfloat16 subject is compared
with a float32 reference at RaNNC's tolerance. Gradient accumulation
updates after every ``gradient_accumulation_steps``-th step (RaNNC's updates on the first);
failures are collected and agreed by all ranks at the end of a test, so a mismatch on one rank
fails the test on every rank instead of leaving the others waiting in the next collective.
"""
import contextlib
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn

from autostage import _autostage
from autostage import rannc as pyrannc
from autostage.options import option_value as _option_value

from models import random_dataset

# float64. The absolute part covers a gradient that is rounding noise (~1e-17): Adam's first
# steps move its parameter by lr * noise / (|noise| + eps), about 1e-11 here.
RTOL = 1e-9
ATOL = 1e-10
MAX_NORM = 1.0
LR = 0.01


class Checks:
    """Failures of one test on this rank; ``agree`` raises on every rank when any rank had one."""

    def __init__(self):
        self.failures = []

    def close(self, what, actual, expected, rtol, atol):
        if actual is None or expected is None:
            if (actual is None) != (expected is None):
                self.failures.append(f"{what}: {actual!r} vs expected {expected!r}")
            return
        if tuple(actual.shape) != tuple(expected.shape):
            self.failures.append(f"{what}: shape {tuple(actual.shape)} vs expected "
                                 f"{tuple(expected.shape)}")
            return
        try:
            torch.testing.assert_close(actual.detach().double().cpu(),
                                       expected.detach().double().cpu(), rtol=rtol, atol=atol)
        except AssertionError as error:
            detail = " ".join(line.strip() for line in str(error).splitlines()[:4])
            self.failures.append(f"{what}: {detail}")

    def equal(self, what, actual, expected):
        if actual != expected:
            self.failures.append(f"{what}: {actual!r} vs expected {expected!r}")

    def agree(self):
        count = torch.tensor([len(self.failures)], dtype=torch.int64)
        ranks = torch.zeros(dist.get_world_size(), dtype=torch.int64)
        ranks[dist.get_rank()] = len(self.failures)
        dist.all_reduce(ranks)
        if int(ranks.sum()) == 0:
            return
        failing = [r for r in range(len(ranks)) if ranks[r] > 0]
        mine = "\n  ".join(self.failures[:20]) if int(count) else "(none on this rank)"
        raise AssertionError(f"failures on ranks {failing}; this rank's:\n  {mine}")


@contextlib.contextmanager
def options(**values):
    """Sets autostage options (process-wide) for the block and restores them after."""
    previous = {key: _option_value(key) for key in values}
    try:
        for key, value in values.items():
            _autostage._set_option(key, str(value))
        yield
    finally:
        for key, value in previous.items():
            _autostage._set_option(key, value)


def _float_to(tensor, dtype):
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def _loader(batch_size, input_dim, output_dim, iterations, dataset, gather_inputs):
    """Each rank's batches: a shard of the global dataset (gather_inputs, as DDP's
    DistributedSampler), or the whole dataset in order (gather_inputs=False: rank 0's batch is
    the batch)."""
    world, rank = pyrannc.get_world_size(), pyrannc.get_rank()
    xs, targets = (dataset or random_dataset)(world * batch_size * iterations, input_dim,
                                              output_dim)
    data = torch.utils.data.TensorDataset(xs, targets)
    sampler = (torch.utils.data.distributed.DistributedSampler(data, num_replicas=world,
                                                               rank=rank, shuffle=False)
               if gather_inputs else torch.utils.data.SequentialSampler(data))
    return torch.utils.data.DataLoader(data, batch_size=batch_size, sampler=sampler)


def _reset_running_stats(model):
    for module in model.modules():
        if hasattr(module, "reset_running_stats"):
            module.reset_running_stats()


def _compare_params(checks, what, reference, rmodel, rtol, atol):
    expected = dict(reference.named_parameters())
    for name in sorted(rmodel.name_to_param):
        checks.close(f"{what} parameter {name}", rmodel.get_param(name), expected[name], rtol,
                     atol)


def _compare_grads(checks, what, reference, rmodel, rtol, atol):
    expected = dict(reference.named_parameters())
    for name in sorted(rmodel.name_to_param):
        checks.close(f"{what} gradient of {name}", rmodel.get_param_grad(name),
                     expected[name].grad, rtol, atol)


def run(model_cls, batch_size, iterations, workdir, loss_out=False, dtype=torch.float64,
        dataset=None, gather_inputs=True, enable_zero=False, allreduce_amp_master_params=False,
        gradient_accumulation_steps=1, rtol=RTOL, atol=ATOL, **module_args):
    """Trains `model_cls()` with DDP and with RaNNCModule on the same data and compares them
    (module docstring). `loss_out`: the model takes (x, target) and returns the loss."""
    checks = Checks()
    world, rank = pyrannc.get_world_size(), pyrannc.get_rank()
    base = model_cls()
    # The reference in float64/float32 as asked; a low-precision subject against float32.
    ref_dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    base = base.to(ref_dtype)
    reference = copy.deepcopy(base)
    subject = copy.deepcopy(base).to(dtype)
    has_param = len(list(base.parameters())) > 0
    opt = torch.optim.Adam(reference.parameters(), lr=LR) if has_param else None
    r_opt = torch.optim.Adam(subject.parameters(), lr=LR) if has_param else None
    if gather_inputs is not True:
        module_args["gather_inputs"] = gather_inputs
    rmodel = pyrannc.RaNNCModule(subject, r_opt, enable_zero=enable_zero,
                                 allreduce_amp_master_params=allreduce_amp_master_params,
                                 **module_args)
    _compare_params(checks, "initial", reference, rmodel, rtol, atol)

    if loss_out:
        def call(model, x, tgt):
            return model(x, tgt)

        def expected_output(out):  # the loss of the global batch: the mean of the ranks'
            loss = out.detach().clone()
            dist.all_reduce(loss)
            return loss / world

        def backward(out, tgt):
            out.backward()
    else:
        def call(model, x, tgt):
            return model(x)

        def expected_output(out):
            return out

        def backward(out, tgt):  # in float32 at least (CPU MSELoss has no bfloat16)
            wide = torch.promote_types(out.dtype, torch.float32)
            nn.MSELoss()(tgt.to(wide), out.to(wide)).backward()

    delay = allreduce_amp_master_params or gradient_accumulation_steps > 1
    pyrannc.delay_grad_allreduce(delay)
    ddp = None
    try:
        loader = _loader(batch_size, base.INPUT_DIM, base.OUTPUT_DIM, iterations, dataset,
                         gather_inputs)
        for step, (x, tgt) in enumerate(loader):
            x, tgt = _float_to(x, ref_dtype), _float_to(tgt, ref_dtype)
            update = not delay or (step + 1) % gradient_accumulation_steps == 0
            if ddp is None:
                traced = torch.jit.trace(reference, (x, tgt) if loss_out else (x,))
                _reset_running_stats(reference)  # tracing ran the model once
                ddp = (nn.parallel.DistributedDataParallel(traced)
                       if has_param and gather_inputs else traced)
            with torch.random.fork_rng():
                if update or not has_param or not gather_inputs:
                    p_out = call(ddp, x, tgt)
                else:
                    with ddp.no_sync():  # gradient accumulation: DDP's delayed allreduce
                        p_out = call(ddp, x, tgt)
            expected = expected_output(p_out)  # collective for losses: on every rank
            r_out = call(rmodel, _float_to(x, dtype), _float_to(tgt, dtype))
            if gather_inputs or rank == 0:
                checks.close(f"step {step} output", r_out, expected, rtol, atol)
            if has_param:
                backward(p_out, tgt)
                backward(r_out, _float_to(tgt, dtype))
                if delay and update:
                    pyrannc.allreduce_grads(rmodel, r_opt)
                if update:
                    torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
                    rmodel.clip_grad_norm(MAX_NORM)
                    if enable_zero:
                        rmodel._sync_orig_params(sync_grad=True)
                    _compare_grads(checks, f"step {step}", reference, rmodel, rtol, atol)
                    opt.step()
                    r_opt.step()
                    opt.zero_grad()
                    r_opt.zero_grad()
            if enable_zero:
                rmodel._sync_orig_params()
            _compare_params(checks, f"step {step}", reference, rmodel, rtol, atol)
        if has_param:
            _check_checkpoint(checks, base, opt, rmodel, r_opt, workdir, dtype, rtol, atol,
                              module_args)
    finally:
        pyrannc.delay_grad_allreduce(False)
        pyrannc.clear()
    pyrannc.barrier()
    checks.agree()


def _check_checkpoint(checks, base, opt, rmodel, r_opt, workdir, dtype, rtol, atol,
                      module_args):
    """RaNNC's last step: save the model and the global optimizer state on rank 0, load the
    model into a fresh copy wrapped again, compare, and load the optimizer state back."""
    model_path = os.path.join(workdir, "model.pt")
    opt_path = os.path.join(workdir, "opt_state.pt")
    model_state = rmodel.state_dict()  # collective
    opt_state = r_opt.state_dict(from_global=True)  # collective
    if pyrannc.get_rank() == 0:
        torch.save(model_state, model_path)
        torch.save(opt_state, opt_path)
    pyrannc.barrier()

    loaded = copy.deepcopy(base).to(dtype)
    loaded.load_state_dict(torch.load(model_path))
    loaded_opt = torch.optim.Adam(loaded.parameters(), lr=LR)
    # RaNNC's script wraps it with Apex AMP on; the optimizer was never prepared by Apex, so the
    # module trains in the parameters' dtype.
    loaded = pyrannc.RaNNCModule(loaded, loaded_opt, enable_apex_amp=True, **module_args)
    loaded_params = dict(loaded.named_parameters())
    for name, param in rmodel.named_parameters():
        checks.close(f"reloaded parameter {name}", loaded_params[name], param, rtol, atol)

    saved = torch.load(opt_path)
    expected = opt.state_dict()
    checks.equal("optimizer param_groups", len(saved["param_groups"]),
                 len(expected["param_groups"]))
    for saved_group, group in zip(saved["param_groups"], expected["param_groups"]):
        checks.equal("optimizer param_group keys", sorted(saved_group), sorted(group))
        for key in group:
            if key == "params":
                checks.equal("optimizer group size", len(saved_group["params"]),
                             len(group["params"]))
            else:
                checks.equal(f"optimizer group {key}", saved_group.get(key), group[key])
        for saved_id, expected_id in zip(saved_group["params"], group["params"]):
            have, want = saved["state"].get(saved_id, {}), expected["state"].get(expected_id, {})
            checks.equal(f"optimizer state keys of parameter {expected_id}", sorted(have),
                         sorted(want))
            for key, value in want.items():
                if isinstance(value, torch.Tensor):
                    checks.close(f"optimizer {key} of parameter {expected_id}", have.get(key),
                                 value, rtol, atol)
                else:
                    checks.equal(f"optimizer {key} of parameter {expected_id}", have.get(key),
                                 value)
    r_opt.load_state_dict(saved, from_global=True)
