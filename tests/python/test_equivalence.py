"""Issue 5 acceptance: autostage.Module under mpirun equals plain single-process PyTorch.

One mpirun per rank count (1, 2, 4) runs every row of equivalence/driver.py's CONFIGS table (and
of its INTERLEAVED table: interleaved 1F1B, virtual_stages=2) for that rank count (3 Adam steps each; outputs, gradients, parameters and buffers compared within
rtol 1e-5 / atol 1e-6). test_matrix_is_a_covering_design checks the table itself.
"""
import itertools
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER_DIR = os.path.join(HERE, "equivalence")
sys.path.insert(0, DRIVER_DIR)

from driver import CONFIGS, INTERLEAVED  # noqa: E402
from mpi_launch import BUILD_PYTHON  # noqa: E402

OPTIONS = {  # column of CONFIGS -> the values every model must hit
    "partition": (2, (1, 2, 4)),
    "pipeline": (3, (1, 4)),
    "schedule": (4, ("gpipe", "1f1b")),
    "recompute": (5, ("always", "never")),
}
MODEL_NAMES = ("mlp", "cnn_bn", "encoder", "resnet18", "tied", "forkjoin", "withloss", "scripted")


def test_matrix_is_a_covering_design():
    assert {c[0] for c in CONFIGS} == set(MODEL_NAMES)
    for config in CONFIGS:
        assert config[2] <= config[1], f"partition_num above the rank count: {config}"
    for model in MODEL_NAMES:
        rows = [c for c in CONFIGS if c[0] == model]
        assert {c[1] for c in rows} == {1, 2, 4}, f"{model} misses a rank count"
        for name, (column, values) in OPTIONS.items():
            assert {c[column] for c in rows} == set(values), f"{model} misses a {name} value"
    assert {c[6] for c in CONFIGS if c[0] == "withloss"} == {"forward", "train_step"}
    columns = {"ranks": (1, (1, 2, 4)), **OPTIONS}
    for (a, (ca, va)), (b, (cb, vb)) in itertools.combinations(columns.items(), 2):
        for x, y in itertools.product(va, vb):
            if (a, b) == ("ranks", "partition") and y > x:
                continue  # impossible: more stages than ranks (checked by the driver's error case)
            assert any(c[ca] == x and c[cb] == y for c in CONFIGS), f"pair {a}={x} {b}={y}"


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_equivalence_matrix(ranks, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=BUILD_PYTHON,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               AUTOSTAGE_COMM_TIMEOUT_S="300", AUTOSTAGE_MEASURE_COMM="false")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
           "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH", "-x", "AUTOSTAGE_COMM_TIMEOUT_S",
           "-x", "AUTOSTAGE_MEASURE_COMM",
           sys.executable, os.path.join(DRIVER_DIR, "driver.py"), str(tmp_path / "profiles")]
    run = subprocess.run(cmd, env=env, cwd=DRIVER_DIR, capture_output=True, text=True,
                         timeout=1200)
    log = run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("rank ")]
    assert run.returncode == 0, "\n".join(lines) or log
    assert not [line for line in lines if ": FAIL" in line], "\n".join(lines)
    expected = [("config", i) for i, c in enumerate(CONFIGS) if c[1] == ranks]
    expected += [("interleaved", i) for i, c in enumerate(INTERLEAVED) if c[1] == ranks]
    for rank in range(ranks):
        for label, index in expected:
            assert any(line.startswith(f"rank {rank}: ok {label} {index} ") for line in lines), \
                f"rank {rank} reported nothing for {label} {index}:\n" + "\n".join(lines)
        if ranks > 1:
            assert any(line.startswith(f"rank {rank}: ok partition_num={2 * ranks}")
                       for line in lines), log
