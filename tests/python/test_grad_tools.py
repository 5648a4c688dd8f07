"""Gradient accumulation (delay_grad_allreduce + allreduce_grads) and global clip_grad_norm on
4 MPI ranks (2 stages, replicated, a tied parameter shared by both) equal plain single-process PyTorch."""
import re
import shutil

import pytest

from mpi_launch import run_driver


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_accumulation_and_clipping_match_plain_pytorch():
    # grad_tools_check.py plans with the uniform planner: 2 stages of 2 replicas whatever the load.
    log = run_driver("grad_tools_check.py")
    for rank in range(4):
        assert f"rank {rank}: grad tools checked; 0 failures" in log, log
    # Really a pipeline with replicas: 2 stages, one of them on several ranks.
    assert "Deployment: 2 stage(s)" in log, log
    assert re.search(r"replicas=[2-9]", log), log
