"""Plan reuse through deployment files: partitioning_dry_run_np plans for 4 ranks on 1 and ends
the process; a 4-rank launch with load_deployment=true loads that plan (no profiling, no
planning) and trains like plain PyTorch; deployments that do not fit a job are refused naming
the field; save_deployment writes the plan made."""
import os
import shutil
import subprocess
import sys

import pytest

from mpi_launch import HERE, mpi_env, mpirun, run_driver

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


def dry_run(path, ranks_to_plan_for):
    env = mpi_env(AUTOSTAGE_PARTITIONING_DRY_RUN_NP=str(ranks_to_plan_for),
                  AUTOSTAGE_DEPLOYMENT_FILE=path, AUTOSTAGE_PARTITION_NUM="2",
                  AUTOSTAGE_MEM_LIMIT_GB="1")
    run = mpirun([sys.executable, os.path.join(HERE, "deployment_file_check.py"), "dryrun", path],
                 env=env, ranks=1)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    assert "FAIL" not in log and "exited improperly" not in log, log
    assert f"Starting dry run of partitioning for {ranks_to_plan_for} ranks on 1 rank(s)" \
        in log, log
    assert f"The dry run for partitioning finished: the deployment for {ranks_to_plan_for} ranks " \
           f"is in {path}" in log, log
    assert os.path.getsize(path) > 0
    return log


def test_dry_run_then_load_on_four_ranks(tmp_path):
    path = str(tmp_path / "np4.deployment")
    dry_run(path, 4)
    log = run_driver("deployment_file_check.py", "train", path, AUTOSTAGE_LOAD_DEPLOYMENT="true",
                     AUTOSTAGE_DEPLOYMENT_FILE=path, AUTOSTAGE_MEM_LIMIT_GB="1")
    for rank in range(4):
        assert f"rank {rank}: train checked; 0 failures" in log, log
    assert f"Loading deployment from {path}" in log, log
    assert "Running profiler" not in log and "Planning on rank 0" not in log, log


def test_deployments_that_do_not_fit_are_refused_naming_the_field(tmp_path):
    dry_run(str(tmp_path / "np4.deployment"), 4)
    dry_run(str(tmp_path / "np2.deployment"), 2)
    log = run_driver("deployment_file_check.py", "mismatch", str(tmp_path),
                     AUTOSTAGE_PARTITION_NUM="2", AUTOSTAGE_MEM_LIMIT_GB="1")
    for rank in range(4):
        assert f"rank {rank}: mismatch checked; 0 failures" in log, log
    assert "Saved the deployment to" in log, log
    print("\n".join(line for line in log.splitlines() if line.startswith("ERROR ")))


def test_dry_run_without_deployment_file_says_so():
    env = mpi_env(AUTOSTAGE_PARTITIONING_DRY_RUN_NP="4")
    env.pop("AUTOSTAGE_DEPLOYMENT_FILE", None)
    run = subprocess.run([sys.executable, os.path.join(HERE, "deployment_file_check.py"),
                          "dryrun", "-"], env=env, capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode != 0, log
    assert "ConfigError" in log and "partitioning_dry_run_np needs deployment_file" in log, log
