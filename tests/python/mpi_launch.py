"""Launching test drivers under mpirun (test side) and ending them (rank side), shared by the
multi-rank Python tests."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
# The build under test: build/ (the LibTorch 1.13 leg) unless BUILD_UNDER_TEST names another, as
# scripts/test does for the PyTorch 2.x leg (build-torch2/, run with that leg's interpreter).
BUILD = os.path.abspath(os.environ.get("BUILD_UNDER_TEST") or os.path.join(ROOT, "build"))
BUILD_PYTHON = os.path.join(BUILD, "python")
CLI = os.environ.get("AUTOSTAGE_CLI", os.path.join(BUILD, "bindings", "cli", "autostage"))


def build_has_cuda():
    """Whether the build under test was configured with -DAUTOSTAGE_WITH_CUDA=ON (read from its
    generated autostage/build_config.h)."""
    with open(os.path.join(BUILD, "include", "autostage", "build_config.h")) as f:
        return "#define AUTOSTAGE_WITH_NCCL 1" in f.read()


def mpi_env(**extra):
    """The environment every rank gets: one OpenMP thread, this build's autostage on the path,
    root allowed, a small profiling repeat count and no minimum span for the timing passes (these
    tests check results, not timings), a generous timeout, and configured (not
    measured) communication costs, so plans do not depend on how busy the machine is: measured
    on a loaded machine, replicas can look too costly and ranks are left without a stage
    (all overridable)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=BUILD_PYTHON,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               AUTOSTAGE_PROFILE_REPEATS="3", AUTOSTAGE_PROFILE_PASS_SECONDS="0",
               AUTOSTAGE_COMM_TIMEOUT_S="120", AUTOSTAGE_MEASURE_COMM="false")
    env.update(extra)
    return env


def mpirun_command(args, env, recovery=False, ranks=4, options=()):
    """The mpirun command line running `args` on `ranks` ranks (2 cores: oversubscribed),
    exporting the autostage, OpenMP and Python path variables of `env`, with mpirun `options`
    (placement, MCA parameters) before them."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), *options]
    if recovery:
        cmd.append("--enable-recovery")  # else mpirun kills every rank when one dies
    for name in env:
        if name.startswith(("AUTOSTAGE_", "RANNC_")) or name in ("OMP_NUM_THREADS", "PYTHONPATH"):
            cmd += ["-x", name]
    return cmd + args


def mpirun(args, env=None, recovery=False, timeout=600, ranks=4, cwd=None):
    """Runs `args` under mpirun_command; returns the CompletedProcess with text output."""
    env = env if env is not None else mpi_env()
    return subprocess.run(mpirun_command(args, env, recovery, ranks), env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def run_driver(script, *args, ranks=4, timeout=600, **env):
    """Runs tests/python/`script` with `args` on `ranks` ranks, asserts it exited 0 and returns
    the combined log."""
    run = mpirun([sys.executable, os.path.join(HERE, script), *map(str, args)],
                 env=mpi_env(**env), timeout=timeout, ranks=ranks)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    return log


def run_phases(script, phases, logdir, ranks=4, timeout=600, **env):
    """Runs tests/python/`script` once per phase of `phases` in one launch on `ranks` ranks
    (mpi_phases.py: as `script PHASE` would run alone, without starting Python, torch and MPI
    again for each); returns {phase: (status, log)}: the phase's exit status (0 on every rank,
    else the first rank's that is not; None where some rank did not end it: the launch's own
    output is then appended to its log) and its ranks' output."""
    os.makedirs(logdir, exist_ok=True)
    run = mpirun([sys.executable, os.path.join(HERE, "mpi_phases.py"), str(logdir),
                  os.path.join(HERE, script), *phases],
                 env=mpi_env(**env), timeout=timeout * max(1, len(phases) // 4), ranks=ranks)
    results = {}
    for phase in phases:
        statuses, logs = [], []
        for rank in range(ranks):
            base = os.path.join(logdir, f"{phase}.{rank}")
            if os.path.exists(base + ".log"):
                with open(base + ".log") as f:
                    logs.append(f.read())
            status = None
            if os.path.exists(base + ".status"):
                with open(base + ".status") as f:
                    status = int(f.read())
            statuses.append(status)
        if None in statuses:
            status = None
            logs.append(f"(the launch, exit status {run.returncode}:)\n{run.stdout}{run.stderr}")
        else:
            status = next((s for s in statuses if s != 0), 0)
        results[phase] = (status, "".join(logs))
    return results


def phase_run(request, script, ranks, key, tmp_path_factory, **env):
    """The result (status, log) of the phase `request`'s test names by its parameter `key`, from
    one run_phases launch per script and rank count running the phases of every test of the same
    test function and rank count the session selected (the first asks for it; tests keep their own
    verdicts). Cached on the session."""
    cache = request.session.__dict__.setdefault("_autostage_phase_runs", {})
    group = (script, request.node.originalname, ranks)
    if group not in cache:
        phases = [item.callspec.params[key] for item in request.session.items
                  if item.originalname == request.node.originalname
                  and item.callspec.params.get("ranks") == ranks and not _marked_skip(item)]
        logdir = tmp_path_factory.mktemp(f"{os.path.splitext(script)[0]}-{ranks}")
        cache[group] = run_phases(script, list(dict.fromkeys(phases)), str(logdir), ranks=ranks,
                                  **env)
    return cache[group][request.node.callspec.params[key]]


def _marked_skip(item):
    """Whether a skip or skipif mark (with a boolean condition) skips test `item`."""
    return any(mark.name == "skip" or (mark.name == "skipif" and any(
        c is True for c in (*mark.args, mark.kwargs.get("condition"))))
        for mark in item.iter_markers())


def finish(rank, failures):
    """Rank side of a driver: prints each failure as `rank R: FAIL ...`, waits for every rank
    (so no rank's exit tears the job down before the others have printed), and exits 1 on any
    failure."""
    import autostage  # only the ranks need it
    for failure in failures:
        print(f"rank {rank}: FAIL {failure}", flush=True)
    autostage.barrier()
    sys.exit(1 if failures else 0)
