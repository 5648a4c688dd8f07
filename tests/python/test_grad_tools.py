"""Gradient accumulation (delay_grad_allreduce + allreduce_grads) and global clip_grad_norm on
4 MPI ranks (2 stages, replicated, a tied parameter shared by both) equal plain single-process PyTorch."""
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_PYTHON = os.path.abspath(os.path.join(HERE, "..", "..", "build", "python"))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_accumulation_and_clipping_match_plain_pytorch():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=BUILD_PYTHON,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               AUTOSTAGE_PROFILE_REPEATS="3", AUTOSTAGE_COMM_TIMEOUT_S="120")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4",
           "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH", "-x", "AUTOSTAGE_PROFILE_REPEATS",
           "-x", "AUTOSTAGE_COMM_TIMEOUT_S",
           sys.executable, os.path.join(HERE, "grad_tools_check.py")]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    for rank in range(4):
        assert f"rank {rank}: grad tools checked; 0 failures" in log, log
    # Really a pipeline with replicas: 2 stages, one of them on several ranks.
    assert "Deployment: 2 stage(s)" in log, log
    assert re.search(r"replicas=[2-9]", log), log
