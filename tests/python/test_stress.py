"""Stress (issue #7): 200 steps of the transformer example on 4 ranks with 2 stages (2 replicas
each); RSS must not grow after 20 warm-up steps and every step's loss must equal plain PyTorch's."""
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_PYTHON = os.path.abspath(os.path.join(HERE, "..", "..", "build", "python"))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_two_hundred_steps_keep_memory_flat_and_losses_equal():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=BUILD_PYTHON,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               AUTOSTAGE_PROFILE_REPEATS="3", AUTOSTAGE_COMM_TIMEOUT_S="120")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4",
           "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH", "-x", "AUTOSTAGE_PROFILE_REPEATS",
           "-x", "AUTOSTAGE_COMM_TIMEOUT_S",
           sys.executable, os.path.join(HERE, "stress_check.py"), "200"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    assert "FAIL" not in log, log
    reports = re.findall(r"rank (\d): 200 steps, rss after warm-up \d+ MiB", log)
    assert sorted(reports) == ["0", "1", "2", "3"], log
    assert "Deployment: 2 stage(s)" in log, log
