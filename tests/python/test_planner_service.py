"""The planning service from a job's side (Note [Planning service]): `autostage serve` plans a
job's deployment (the job replays its partition log), a second launch gets it from the store
without profiling (the service keeps the profile under the job's profile key),
SIGTERM stops the service cleanly, and a job whose service is gone plans locally and says why.
Needs this build's CLI (build/bindings/cli/autostage, or $AUTOSTAGE_CLI)."""
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mpi_launch import CLI, HERE, mpi_env, mpirun_command, run_driver


def launch(address, ranks=2):
    log = run_driver("planner_service_check.py", address, ranks=ranks)
    for rank in range(ranks):
        assert f"rank {rank}: planner service run ok" in log, log
    return log


def wait_for(address, server):
    """Polls `autostage status` until the service answers (bounded; not a speed check)."""
    for _ in range(600):
        assert server.poll() is None, server.communicate()[1]
        done = subprocess.run([CLI, "status", "--server", address, "--timeout-s", "2"],
                              capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout
        time.sleep(0.1)
    raise AssertionError("the planning service did not start")


@pytest.mark.skipif(shutil.which("mpirun") is None or not os.path.exists(CLI),
                    reason="mpirun or the autostage CLI missing")
def test_jobs_get_their_plan_from_the_service_and_plan_locally_without_it(tmp_path):
    address = f"unix:{tmp_path}/planner.sock"
    store = tmp_path / "store"
    server = subprocess.Popen([CLI, "serve", "--listen", address, "--store", str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(address, server)
        first = launch(address)
        assert "Plan " in first and "from the planning service at " + address in first, first
        assert "(planned for this job)" in first, first
        assert "has no profile of this model yet: profiling here" in first, first
        assert "Assigned subgraph" in first, first  # the service's partition log, replayed
        # Planned once, by the service (its lines replayed), not here as well.
        assert first.count("Planner options:") == 1 and "planning locally" not in first, first

        second = launch(address)  # a relaunch: the service has the profile and the plan
        assert "(from its store)" in second, second
        assert "Running profiler" not in second, second
        status = subprocess.run([CLI, "status", "--server", address, "--json"],
                                capture_output=True, text=True, check=True).stdout
        assert '"plans_made": 1' in status and '"store_hits": 1' in status, status
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=120)
    assert server.returncode == 0, err
    assert "SIGTERM received" in err and "store consistent" in err, err
    assert len(list((store / "plans").glob("*.answer"))) == 1
    assert not os.path.exists(f"{tmp_path}/planner.sock")

    alone = launch(address)  # the service is gone: plan here
    assert "did not answer" in alone and "planning locally" in alone, alone
    assert "Assigned subgraph" in alone, alone


@pytest.mark.skipif(shutil.which("mpirun") is None or not os.path.exists(CLI),
                    reason="mpirun or the autostage CLI missing")
def test_two_jobs_at_once_then_a_service_killed_while_a_job_waits(tmp_path):
    address = f"unix:{tmp_path}/planner.sock"
    server = subprocess.Popen([CLI, "serve", "--listen", address, "--store",
                               str(tmp_path / "store")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(address, server)
        with ThreadPoolExecutor(2) as pool:  # two 2-rank jobs planning through it at once
            logs = list(pool.map(lambda _: launch(address), range(2)))
        for log in logs:
            assert "from the planning service at " + address in log, log
            assert "planning locally" not in log, log

        # A job asks a service that stops answering (frozen), which is then killed (SIGKILL)
        # while the job waits: the job plans here and says why.
        server.send_signal(signal.SIGSTOP)
        log_path = tmp_path / "job.log"
        env = mpi_env()
        script = os.path.join(HERE, "planner_service_check.py")
        with open(log_path, "w") as out:
            job = subprocess.Popen(mpirun_command([sys.executable, script, address], env,
                                                  ranks=2),
                                   env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
            for _ in range(3000):  # bounded wait for the job's call (not a speed check)
                if "Asking the planning service" in log_path.read_text() or \
                        job.poll() is not None:
                    break
                time.sleep(0.1)
            server.send_signal(signal.SIGKILL)
            job.wait(timeout=600)
        log = log_path.read_text()
        assert job.returncode == 0, log
        assert "Asking the planning service" in log, log
        assert "planning locally" in log, log
        for rank in range(2):
            assert f"rank {rank}: planner service run ok" in log, log
    finally:
        server.kill()
        server.communicate(timeout=120)


@pytest.mark.skipif(not os.path.exists(CLI), reason="the autostage CLI missing")
def test_whatif_prints_a_row_per_point(tmp_path):
    done = subprocess.run([CLI, "whatif", "--synthetic", "mlp:layers=8", "--devices", "2,4",
                           "--device-memory", "1KiB,1GiB", "--batch", "16", "--csv"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("devices,device_memory_gib,batch,schedule_option,feasible"), lines
    rows = [line.split(",") for line in lines[1:]]
    assert len(rows) == 4, lines
    assert [r[4] for r in rows] == ["false", "true", "false", "true"], lines


@pytest.mark.skipif(not os.path.exists(CLI), reason="the autostage CLI missing")
def test_memory_bound_of_the_service(tmp_path):
    """--memory-mib bounds what the service keeps decoded in memory (Note [Answers from
    memory]); with 0 it keeps nothing and still answers from its store. A bad value is refused
    by name."""
    bad = subprocess.run([CLI, "serve", "--memory-mib", "-1"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--memory-mib must be >= 0" in bad.stderr, bad.stderr
    address = f"unix:{tmp_path}/planner.sock"
    server = subprocess.Popen([CLI, "serve", "--listen", address, "--memory-mib", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(address, server)
        plan = [CLI, "plan", "--synthetic", "mlp:layers=8", "--devices", "4", "--device-memory",
                "1GiB", "--batch", "16", "--json", "--server", address]
        first = subprocess.run(plan, capture_output=True, text=True, check=True).stdout
        second = subprocess.run(plan, capture_output=True, text=True, check=True).stdout
        assert '"from_store": false' in first and '"from_store": true' in second, second
        assert first.split('"plan_key"')[1] == second.split('"plan_key"')[1]
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=120)
    assert server.returncode == 0
