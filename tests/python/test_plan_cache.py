"""plan_cache_dir, the local planner's store (Note [One planner]): the first launch profiles,
plans and stores; the second is answered from the store and skips profiling and planning; a
damaged stored plan is reported and planned again (with the stored profile); another world size
and batch plans anew with the stored profile."""
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
def test_second_launch_loads_the_stored_plan(tmp_path):
    cache = str(tmp_path / "plans")
    store = f"the plan store at {cache}"
    first = launch(cache)
    assert "Running profiler" in first and f"saved in {store} (plan_cache_dir)" in first, first
    assert "Assigned subgraph" in first, first  # the partition log, printed as it was planned
    files = glob.glob(os.path.join(cache, "plans", "*.answer"))
    assert len(files) == 1, os.listdir(cache)
    assert len(glob.glob(os.path.join(cache, "profiles", "*.profile"))) == 1
    saved = open(files[0], "rb").read()

    second = launch(cache)
    assert f"from {store} (plan_cache_dir): skipping planning" in second, second
    assert "Running profiler" not in second and "saved in" not in second, second
    assert "Assigned subgraph" in second, second  # the stored partition log, replayed
    assert open(files[0], "rb").read() == saved  # read, not rewritten

    with open(files[0], "wb") as f:
        f.write(saved[: len(saved) // 2])  # damaged: truncated
    third = launch(cache)
    assert "removed from the store, planning again" in third, third
    assert "Running profiler" not in third and f"saved in {store}" in third, third
    assert len(open(files[0], "rb").read()) > len(saved) // 2  # replaced by a fresh plan
    assert "skipping planning" in launch(cache)  # which is found again

    # Another world size (and global batch): planned anew, with the stored profile (the profile
    # key names neither: Note [Profile key]).
    fourth = launch(cache, ranks=1)
    assert "Running profiler" not in fourth and f"saved in {store}" in fourth, fourth
    assert len(glob.glob(os.path.join(cache, "plans", "*.answer"))) == 2
