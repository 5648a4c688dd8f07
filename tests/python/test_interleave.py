"""Interleaved 1F1B (issue 19): virtual stages equal plain PyTorch with Adam on 2 and 4 ranks,
with and without ZeRO-1 (interleave_check.py); the planner picks interleaving when it simulates
faster and logs it; bad options are refused before anything runs."""
import re
import shutil

import pytest

from mpi_launch import run_driver

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


def run(ranks, *args):
    log = run_driver("interleave_check.py", *args, ranks=ranks)
    phase = " ".join(map(str, args))
    for rank in range(ranks):
        assert re.search(rf"rank {rank}: interleave {args[0]}.* checked; 0 failures", log), log
    return log


@needs_mpirun
@pytest.mark.parametrize("ranks,virtual,zero", [(2, 2, 0), (4, 2, 0), (4, 2, 1), (2, 4, 0)])
def test_interleaved_equals_plain_pytorch(ranks, virtual, zero):
    log = run(ranks, "train", virtual, zero)
    # The partition log's header names the virtual stages.
    assert re.search(rf"\[DPStaging\] \[info\] Estimated profiles .* schedule=1f1b v={virtual} ",
                     log), log
    if zero:
        assert re.search(r"graph=STAGE_\d+_\d+ repl=2 tp=1 zero=1 ", log), log


@needs_mpirun
def test_interleaved_tensor_parallel_stages_equal_plain_pytorch():
    # Issue 30: 2 positions of tp=2 groups, 2 virtual stages each.
    log = run(4, "tensor", 2)
    assert re.search(r"Estimated profiles .* schedule=1f1b v=2 ", log), log
    assert len(re.findall(r"graph=STAGE_\d+_\d+ repl=1 tp=2 ", log)) == 4, log
    # Both members of a group hold slices (which group's stages hold linear pairs depends on the
    # measured cut).
    sliced = [int(n) for n in re.findall(r"rank \d: (\d+) parameter\(s\) held in slices", log)]
    assert len(sliced) == 4 and sum(1 for n in sliced if n > 0) >= 2, log


@needs_mpirun
def test_planner_picks_interleaving_when_it_simulates_faster():
    log = run(2, "auto")
    assert re.search(r"Interleaved 1f1b v=\d simulates [\d.]+ ms against [\d.]+ ms "
                     r"\(without interleaving\): chosen", log), log


@pytest.mark.parametrize("value,call,match", [
    (3, "forward", r"virtual_stages='3' is unknown; use auto"),
    (2, "forward", r"virtual_stages=2 runs the interleaved 1f1b schedule, which only "
                   r"train_step"),
], ids=["unknown_value", "forward_runs_gpipe"])
def test_virtual_stages_refused_before_planning(value, call, match):
    """Planner options are checked when the first call plans, before profiling."""
    import torch
    import autostage
    from autostage import _autostage
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    try:
        wrapped = autostage.Module(model, virtual_stages=value)
        with pytest.raises(autostage.ConfigError, match=match):
            wrapped(torch.randn(4, 3))
    finally:
        _autostage._set_option("virtual_stages", "auto")
