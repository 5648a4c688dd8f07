"""Size arithmetic on traced ints and scripted loops/branches without outputs train like plain
PyTorch on 1-4 stages (traced_code_check.py): RaNNC's BasicModel (flattened size from a loop of
in-place products) and FunctionModel (a scripted loop writing into its input) pattern, and more."""
import shutil

import pytest

from mpi_launch import run_driver

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


@needs_mpirun
def test_traced_size_arithmetic_and_scripted_loops_match_plain_pytorch():
    from autostage.export import available
    front_ends = ["torchscript", "auto"] if available() else ["auto"]
    log = run_driver("traced_code_check.py", *front_ends)
    for rank in range(4):
        assert f"rank {rank}: traced code checked; 0 failures" in log, log
    if "auto" in front_ends and len(front_ends) > 1:  # PyTorch 2.x: auto means export
        assert "calls TorchScript code (the scripted function" in log, log
