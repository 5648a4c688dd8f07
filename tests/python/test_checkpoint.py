"""Checkpoints: state_dict gathered from the stages on 4 ranks equals plain PyTorch's and loads
into the plain model; loading it on 2 ranks and training 3 more steps equals 6 plain steps."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_PYTHON = os.path.abspath(os.path.join(HERE, "..", "..", "build", "python"))


def run(ranks, phase, path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=BUILD_PYTHON,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               AUTOSTAGE_PROFILE_REPEATS="3", AUTOSTAGE_COMM_TIMEOUT_S="120")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
           "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH", "-x", "AUTOSTAGE_PROFILE_REPEATS",
           "-x", "AUTOSTAGE_COMM_TIMEOUT_S",
           sys.executable, os.path.join(HERE, "checkpoint_check.py"), phase, path]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    for rank in range(ranks):
        assert f"rank {rank}: checkpoint {phase} checked; 0 failures" in log, log
    return log


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_checkpoint_saved_on_four_ranks_resumes_on_two(tmp_path):
    path = str(tmp_path / "model.pt")
    run(4, "save", path)
    assert os.path.getsize(path) > 0
    run(2, "resume", path)
