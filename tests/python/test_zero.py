"""ZeRO-1 in replicated stages (issue 19): equal to plain PyTorch with Adam and with SGD momentum,
gradient accumulation and clipping on 2 and 4 ranks; optimizer state saved on 4 ranks resumes
on 2 (zero_check.py). Unsupported optimizers are refused before anything is planned."""
import re
import shutil

import pytest
import torch

from mpi_launch import run_driver

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


def run(ranks, phase, arg):
    log = run_driver("zero_check.py", phase, arg, ranks=ranks)
    for rank in range(ranks):
        assert f"rank {rank}: zero {phase} checked; 0 failures" in log, log
    return log


@needs_mpirun
@pytest.mark.parametrize("ranks,optimizer", [(2, "adam"), (4, "adam"), (4, "sgd")])
def test_zero1_equals_plain_pytorch(ranks, optimizer):
    log = run(ranks, "train", optimizer)
    # The partition log line of the sharded stage says so.
    assert "zero=1" in log, log


@needs_mpirun
def test_zero_auto_picks_zero1_where_only_it_fits():
    log = run(2, "auto", "adam")
    assert "zero=auto" in log, log  # the planner options line
    assert re.search(r"\[DPStaging\] \[info\] graph=STAGE_\d+_\d+ repl=2 tp=1 zero=1 ", log), log


@needs_mpirun
def test_zero1_optimizer_state_saved_on_four_ranks_resumes_on_two(tmp_path):
    path = str(tmp_path / "zero.pt")
    run(4, "save", path)
    run(2, "resume", path)


@pytest.mark.parametrize("make", [
    lambda params: torch.optim.LBFGS(params),
    lambda params: torch.optim.SparseAdam(params),
], ids=["LBFGS", "SparseAdam"])
def test_zero1_refuses_optimizers_without_elementwise_state(make):
    import autostage
    from autostage import _autostage
    model = torch.nn.Linear(3, 2)
    optimizer = make(list(model.parameters()))
    name = type(optimizer).__name__
    try:
        with pytest.raises(autostage.UnsupportedError,
                           match=rf"torch\.optim\.\w+\.{name} is not known.*zero=0"):
            autostage.Module(model, optimizer, zero=1)
    finally:
        _autostage._set_option("zero", "auto")


def test_zero_auto_without_a_shardable_optimizer_plans_without_zero():
    import autostage
    from autostage import _autostage
    model = torch.nn.Linear(3, 2)
    try:
        wrapped = autostage.Module(model, torch.optim.LBFGS(model.parameters()), zero="auto")
        assert wrapped._zero_off
        wrapped(torch.randn(4, 3)).sum().backward()  # plans under zero=0 ...
        assert wrapped._impl.deployment_info()["options"]["zero"] == "0"
        assert 'zero = "auto"' in autostage.show_config()  # ... and leaves the option alone
        # Note [Per-module plan options]: another module of the process keeps zero=auto, also
        # when the first one plans again after it.
        other = torch.nn.Linear(3, 2)
        shardable = autostage.Module(other, torch.optim.Adam(other.parameters()))
        assert not shardable._zero_off
        shardable(torch.randn(4, 3)).sum().backward()
        assert shardable._impl.deployment_info()["options"]["zero"] == "auto"
        wrapped.eval()
        wrapped(torch.randn(4, 3))  # a second plan (eval mode) of the first module
        assert wrapped._impl.deployment_info()["options"]["zero"] == "0"
    finally:
        _autostage._set_option("zero", "auto")


def test_zero_step_wrapper_steps_the_pieces_and_keeps_lr_schedulers_working():
    """Note [ZeRO-1 optimizer] without MPI: a shard of elements [2, 5) is stepped, gather runs
    once per step, zero_grad clears the whole gradient, and LR schedulers made before and after
    the wrapping count steps without warnings."""
    import warnings
    from autostage.optimizer import make_shards, patch_zero_step
    p = torch.nn.Parameter(torch.arange(6.0))
    optimizer = torch.optim.SGD([p], lr=0.1)
    before = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    shards, _ = make_shards([(p, 2, 3), (p, 0, 0)])
    optimizer.param_groups[0]["params"] = [shard for shard, *_ in shards.values()]
    gathers = []
    # q: sharded too, but this rank owns none of it (a zero-length piece): zero_grad clears its
    # gradient all the same (a gathered whole gradient must not leak into the next step).
    q = torch.nn.Parameter(torch.zeros(4))
    patch_zero_step(optimizer, lambda: shards, lambda: gathers.append(1), lambda: [p, q])
    after = torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.9)
    p.grad = torch.ones(6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer.step()
        before.step()
        after.step()
    assert gathers == [1]
    assert torch.allclose(p.detach(), torch.tensor([0.0, 1.0, 1.9, 2.9, 3.9, 5.0]))
    q.grad = torch.ones(4)
    optimizer.zero_grad()
    assert torch.equal(p.grad, torch.zeros(6))
    assert torch.equal(q.grad, torch.zeros(4))
    optimizer.zero_grad(set_to_none=True)
    assert p.grad is None
