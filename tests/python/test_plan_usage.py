"""The plan is what runs (Note [Plan usage] in core/plan_usage.h): forward()/backward() gets a
gpipe plan, train_step a 1f1b one, a no_grad forward an inference plan; switching between them
plans each once; the runtime's trace shows the recorded schedule; every rank's memory is measured
and summarised (usage_check.py, 2 ranks)."""
import re
import shutil

import pytest

from mpi_launch import run_driver


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_each_usage_gets_its_plan_and_runs_its_schedule(tmp_path):
    log = run_driver("usage_check.py", tmp_path / "trace", ranks=2)
    for rank in range(2):
        assert f"rank {rank}: usage checked; 0 failures" in log, log
    # Profiled once; planned once per usage, each switch logged. (The second forward_backward
    # planning is the refused schedule=1f1b module's: refused before profiling.)
    assert log.count("Running profiler") == 1, log
    assert log.count("Planning on rank 0 for forward_backward") == 2, log
    assert log.count("Planning on rank 0 for train_step") == 1, log
    assert log.count("Planning on rank 0 for inference") == 1, log
    assert "Switching from forward_backward to train_step: planning it (once)" in log, log
    assert "Switching from train_step to forward_backward: using its deployment" in log, log
    assert "Switching from forward_backward to inference: planning it (once)" in log, log
    assert "Switching from inference to forward_backward: using its deployment" in log, log
    assert re.search(r"schedule=gpipe v=1 precision=fp32 usage=forward_backward", log), log
    assert re.search(r"schedule=1f1b v=[124] precision=fp32 usage=train_step", log), log
    # The info summary after the first steps, one line per rank, printed by rank 0.
    for rank in range(2):
        size = r"[\d.]+ [KMG]?i?B"
        assert re.search(rf"peak memory rank {rank}: measured {size}, predicted {size} "
                         r"\([+-]\d+%\)", log), log
