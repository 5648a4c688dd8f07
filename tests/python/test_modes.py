"""train()/eval() on a deployed module: each mode is traced once and planned once per usage (here
to different plans), parameters, BatchNorm buffers and Adam state follow the switches, torch.no_grad()
inference keeps no graph, and everything equals plain PyTorch (modes_check.py, 4 ranks)."""
import re
import shutil

import pytest

from mpi_launch import run_driver


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_train_eval_switches_match_plain_pytorch():
    log = run_driver("modes_check.py")
    for rank in range(4):
        assert f"rank {rank}: modes checked; 0 failures" in log, log
    # One trace per mode and one plan per mode and usage (Note [Plan usage]), whatever the number
    # of switches: 4 stages in train mode, 2 in eval mode, where the no_grad forward gets an
    # inference plan and the training step in eval mode a forward_backward one.
    assert log.count("Planning on rank 0") == 4, log  # + once after _undeploy()
    assert log.count("Planning on rank 0 for inference") == 1, log
    assert "Switching from inference to forward_backward: planning it (once)" in log, log
    assert "Deployment: 4 stage(s)" in log and "Deployment: 2 stage(s)" in log, log
    assert re.search(r"replicas=[2-9]", log), log  # the eval plan replicates a stage
    assert "Switching from train to eval mode: tracing and planning it (once)" in log, log
    assert "Switching from eval to train mode: using its deployment" in log, log
