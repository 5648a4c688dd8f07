"""Issue 25: a training script's calls on autostage.Module print no deprecation warning of
autostage's own making, on either platform: warnings_check.py turns DeprecationWarning and
FutureWarning into errors on 2 ranks, and the log (Python warnings and what LibTorch's C++
TORCH_WARN prints to stderr) must mention no deprecation."""
import re
import shutil

import pytest

from mpi_launch import run_driver


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_no_deprecation_warnings_from_autostage():
    log = run_driver("warnings_check.py", ranks=2)
    for rank in range(2):
        assert f"rank {rank}: calls done" in log, log
    deprecations = [line for line in log.splitlines() if re.search(r"deprecat", line, re.I)]
    assert not deprecations, "\n".join(deprecations)
