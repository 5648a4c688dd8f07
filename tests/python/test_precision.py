"""precision="bf16" (autocast stages, fp32 master weights) on 2 and 4 MPI ranks equals plain
PyTorch under torch.autocast on the same micro-batches, also with ZeRO-1 on 4 ranks;
precision="fp16" on 2 ranks where the build's LibTorch runs it on the CPU (2.5 or later), refused
on the CPU elsewhere."""
import re
import shutil

import pytest

from autostage import _autostage
from mpi_launch import run_driver


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
@pytest.mark.parametrize("ranks", [2, 4])
def test_bf16_matches_plain_autocast(ranks):
    log = run_driver("precision_check.py", ranks=ranks)
    for rank in range(ranks):
        assert f"rank {rank}: precision checked; 0 failures" in log, log
        if ranks == 2 and _autostage._cpu_fp16_autocast():  # Note [fp16 on the CPU]
            # The MLP's outputs in fp16 as plain autocast's; the encoder's train_step loss fp32.
            assert f"rank {rank}: mlp gpipe recompute=never fp16 output dtype torch.float16" \
                in log, log
            assert f"rank {rank}: encoder 1f1b recompute=always fp16 output dtype torch.float32" \
                in log, log
        elif ranks == 2:
            assert f"rank {rank}: fp16 refused: " in log, log
        else:
            assert f"rank {rank}: mlp 1f1b recompute=never zero=1 output" in log, log
    # The planner accounted for the precision (Note [Pipeline cost model]).
    assert re.search(r"Estimated profiles of subgraphs: .* precision=bf16", log), log
    assert re.search(r"cast=[1-9]", log), log
