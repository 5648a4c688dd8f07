"""Stress (issue #7): 200 steps of the transformer example on 4 ranks with 2 stages (2 replicas
each); RSS must not grow after 20 warm-up steps and every step's loss must equal plain PyTorch's."""
import re
import shutil

import pytest

from mpi_launch import run_driver


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_two_hundred_steps_keep_memory_flat_and_losses_equal():
    log = run_driver("stress_check.py", 200, timeout=900)
    assert "FAIL" not in log, log
    reports = re.findall(r"rank (\d): 200 steps, rss after warm-up \d+ MiB", log)
    assert sorted(reports) == ["0", "1", "2", "3"], log
    assert "Deployment: 2 stage(s)" in log, log
