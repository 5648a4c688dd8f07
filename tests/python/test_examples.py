"""The examples run end to end for two steps with tiny sizes (1 or 2 ranks).

Each run checks the printed output: `#Parameters=` against a parameter count computed here
independently of the example's code, one finite loss per step, and the partition log.
"""
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

from mpi_launch import BUILD_PYTHON

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples")
ENV_KEYS = ("OMP_NUM_THREADS", "PYTHONPATH", "AUTOSTAGE_PROFILE_REPEATS",
            "AUTOSTAGE_PROFILE_PASS_SECONDS",
            "AUTOSTAGE_COMM_TIMEOUT_S", "AUTOSTAGE_PROFILE_CALIBRATION_BLOCKS",
            "AUTOSTAGE_MEASURE_COMM")
needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


def run_example(script, args, ranks):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=BUILD_PYTHON,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               AUTOSTAGE_PROFILE_REPEATS="3", AUTOSTAGE_PROFILE_PASS_SECONDS="0",
               AUTOSTAGE_COMM_TIMEOUT_S="120", AUTOSTAGE_PROFILE_CALIBRATION_BLOCKS="1", AUTOSTAGE_MEASURE_COMM="false")
    command = [sys.executable, os.path.join(EXAMPLES, script), *args]
    if ranks > 1:
        exports = [item for key in ENV_KEYS for item in ("-x", key)]
        command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
                   *exports, *command]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    return log


def check_output(log, parameters, steps, stages):
    counts = re.findall(r"^#Parameters=(\d+)$", log, re.MULTILINE)
    assert counts == [str(parameters)], log  # printed once, by rank 0
    losses = [float(v) for v in re.findall(r"^step \d+ loss (\S+)", log, re.MULTILINE)]
    assert len(losses) == steps, log
    assert all(math.isfinite(v) and v > 0 for v in losses), losses
    assert "[Decomposer] [info] Available device memory:" in log, log
    stage_lines = re.findall(r"\[DPStaging\] \[info\] graph=STAGE_\d+_\d+ repl=\d+", log)
    assert len(stage_lines) == stages, log
    assert len(re.findall(r"Assigned subgraph STAGE_\d+_\d+ to rank\[", log)) == stages, log
    assert "Routes verification passed." in log
    assert "Module is ready. (rank0)" in log


def transformer_parameters(vocab, dim, layers, seq, tied, heads=2, kv_heads=None):
    per_layer = 2 * (2 * dim)                 # two LayerNorms
    if kv_heads is None:
        per_layer += 3 * dim * dim + 3 * dim  # fused q, k, v projection
    else:                                     # q; k and v of kv_heads heads
        kv = kv_heads * dim // heads
        per_layer += dim * dim + dim + 2 * (dim * kv + kv)
    per_layer += dim * dim + dim              # output projection
    per_layer += 4 * dim * dim + 4 * dim + 4 * dim * dim + dim  # MLP
    head = 0 if tied else vocab * dim
    return vocab * dim + seq * dim + layers * per_layer + 2 * dim + head


@needs_mpirun
def test_tutorial_on_two_ranks_forced_into_two_stages():
    batch, hidden, layers = 4, 16, 3
    log = run_example("tutorial.py", [str(batch), str(hidden), str(layers), "--steps", "2",
                                      "--partition-num", "2"], ranks=2)
    check_output(log, layers * (hidden * hidden + hidden), steps=2, stages=2)
    assert "global batch 8 = 4 per rank x 2 ranks" in log


def test_tutorial_rejects_bad_arguments_with_usage():
    run = subprocess.run([sys.executable, os.path.join(EXAMPLES, "tutorial.py"), "8", "0"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=BUILD_PYTHON))
    assert run.returncode == 2
    assert "usage: tutorial.py" in run.stderr
    assert "HIDDEN: expected a positive integer, got 0" in run.stderr


@needs_mpirun
@pytest.mark.parametrize("mode,tied,kv_heads", [("forward", True, None),
                                                ("train_step", False, None),
                                                ("train_step", True, 1)])
def test_transformer_lm_on_two_stages(mode, tied, kv_heads):
    vocab, dim, layers, seq = 32, 16, 2, 8
    args = ["--vocab", str(vocab), "--dim", str(dim), "--layers", str(layers), "--seq", str(seq),
            "--heads", "2", "--batch", "2", "--steps", "2", "--mode", mode, "--partition-num", "2"]
    args += [] if kv_heads is None else ["--kv-heads", str(kv_heads)]  # grouped-query attention
    log = run_example("transformer_lm.py", args + ([] if tied else ["--untied"]), ranks=2)
    check_output(log, transformer_parameters(vocab, dim, layers, seq, tied, 2, kv_heads), steps=2,
                 stages=2)


def test_resnet18_on_one_rank():
    torchvision = pytest.importorskip("torchvision")
    log = run_example("resnet.py", ["--batch", "2", "--image-size", "16", "--steps", "2"], ranks=1)
    expected = sum(p.numel() for p in torchvision.models.resnet18(num_classes=10).parameters())
    check_output(log, expected, steps=2, stages=1)
