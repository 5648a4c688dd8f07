"""plan_cache_dir: the first launch plans and saves; the second loads the plan and skips profiling
and planning; a damaged cache file is reported and replaced; another batch size plans anew."""
import glob
import os
import shutil

import pytest

from mpi_launch import run_driver


def launch(cache_dir, ranks=2):
    log = run_driver("plan_cache_check.py", cache_dir, ranks=ranks)
    for rank in range(ranks):
        assert f"rank {rank}: plan cache run ok" in log, log
    return log


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_second_launch_loads_the_cached_plan(tmp_path):
    cache = str(tmp_path / "plans")
    first = launch(cache)
    assert "Running profiler" in first and "Saved the plan to the plan cache" in first, first
    files = glob.glob(os.path.join(cache, "plan-*-np2-b8-*.deployment"))
    assert len(files) == 1, os.listdir(cache)
    saved = open(files[0], "rb").read()

    second = launch(cache)
    assert "Loaded the plan from the plan cache" in second, second
    assert "Running profiler" not in second and "Planning on rank 0" not in second, second
    assert open(files[0], "rb").read() == saved  # read, not rewritten

    with open(files[0], "wb") as f:
        f.write(saved[: len(saved) // 2])  # damaged: truncated
    third = launch(cache)
    assert "Ignoring the cached plan" in third and "Running profiler" in third, third
    assert len(open(files[0], "rb").read()) > len(saved) // 2  # replaced by a fresh plan
    assert "Loaded the plan from the plan cache" in launch(cache)  # which loads again

    fourth = launch(cache, ranks=1)  # another world size (and global batch): a new entry
    assert "Running profiler" in fourth, fourth
    assert len(glob.glob(os.path.join(cache, "*.deployment"))) == 2
