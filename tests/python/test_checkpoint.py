"""Checkpoints: state_dict gathered from the stages on 4 ranks equals plain PyTorch's and loads
into the plain model; loading it on 2 ranks and training 3 more steps equals 6 plain steps; a
checkpoint that does not fit is refused on every rank and changes no stage (checkpoint_check.py;
one-process cases of save_checkpoint / load_checkpoint are in test_checkpoint_files.py). The
same with Adam and the optimizer's global state (state_dict(from_global=True)), which also loads
into a plain torch.optim.Adam."""
import os
import re
import shutil

import pytest

from mpi_launch import run_driver


def run(ranks, phase, path):
    log = run_driver("checkpoint_check.py", phase, path, ranks=ranks)
    for rank in range(ranks):
        assert f"rank {rank}: checkpoint {phase} checked; 0 failures" in log, log
    return log


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_checkpoint_saved_on_four_ranks_resumes_on_two(tmp_path):
    path = str(tmp_path / "model.pt")
    log = run(4, "save", path)
    # The Adam part ran with a replicated stage (its optimizer state comes from one replica).
    assert re.search(r"Deployment: 2 stage\(s\)", log) and re.search(r"replicas=[2-9]", log), log
    assert os.path.getsize(path) > 0
    run(2, "resume", path)
