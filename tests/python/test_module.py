"""autostage.Module trained on 4 MPI ranks equals plain single-process PyTorch."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_PYTHON = os.path.abspath(os.path.join(HERE, "..", "..", "build", "python"))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_module_on_four_ranks_matches_plain_pytorch():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=BUILD_PYTHON,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               AUTOSTAGE_PROFILE_REPEATS="3", AUTOSTAGE_COMM_TIMEOUT_S="120")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4",
           "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH", "-x", "AUTOSTAGE_PROFILE_REPEATS",
           "-x", "AUTOSTAGE_COMM_TIMEOUT_S",
           sys.executable, os.path.join(HERE, "mpi_module_check.py")]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    for rank in range(4):
        assert f"rank {rank}: checked" in log, log
    assert "FAIL" not in log, log
    assert "Routes verification passed." in log
    assert "Module is ready. (rank0)" in log
    assert "Loading deployment from" in log  # the second module reused the saved plan
