"""autostage.Module trained on 4 MPI ranks equals plain single-process PyTorch."""
import shutil

import pytest

from mpi_launch import run_driver


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_module_on_four_ranks_matches_plain_pytorch():
    log = run_driver("mpi_module_check.py")
    for rank in range(4):
        assert f"rank {rank}: checked" in log, log
    assert "FAIL" not in log, log
    assert "Routes verification passed." in log
    assert "Module is ready. (rank0)" in log
    assert "Loading deployment from" in log  # the second module reused the saved plan
