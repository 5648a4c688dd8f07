"""Runs the RaNNC test suite port (tests/rannc) under mpirun on 1, 2 and 4 ranks and prints its
summary; exits non-zero when a test failed on any rank or a launch did not end cleanly.

    python tests/rannc/run_suite.py                  # 1, 2 and 4 ranks
    python tests/rannc/run_suite.py --ranks 2 -- -k zero   # pytest arguments after --

Every rank runs the same pytest session (as RaNNC's suite runs under mpirun); a test passed when
it passed on every rank. The build under test is BUILD_UNDER_TEST (default build/), run with this
interpreter. Each launch's full log is kept in its work directory and its tail printed on failure.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from mpi_launch import BUILD, mpi_env, mpirun_command  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def outcomes(workdir, ranks):
    """{test id: [outcome per rank]} from the ranks' results files (missing: 'no result')."""
    per_test = {}
    for rank in range(ranks):
        path = os.path.join(workdir, f"results.{rank}.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            results = json.load(f)
        for outcome, entries in results.items():
            for entry in entries:
                per_test.setdefault(entry["test"], {})[rank] = (outcome, entry.get("reason", ""))
    return per_test


def extensions_env():
    """TORCH_EXTENSIONS_DIR for this build (the two legs' LibTorch differ), with test_native.py's
    C++ operator compiled there once, here, rather than by every rank of every launch."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=os.path.join(BUILD, "torch_extensions"),
               PYTHONPATH=os.pathsep.join([os.path.join(BUILD, "python"), HERE]))
    subprocess.run([sys.executable, "-c", "import models; models.load_native_ops()"], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    return env["TORCH_EXTENSIONS_DIR"]


def run(ranks, pytest_args, timeout, extensions):
    workdir = tempfile.mkdtemp(prefix=f"rannc-suite-{ranks}-")
    env = mpi_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                  TORCH_EXTENSIONS_DIR=extensions)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], HERE])
    command = (mpirun_command([], env, ranks=ranks)
               + ["-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "TORCH_EXTENSIONS_DIR"]
               + [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "--color=no", HERE,
                  f"--workdir={workdir}", *pytest_args])
    start = time.monotonic()
    log_path = os.path.join(workdir, "log.txt")
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(command, env=env, cwd=workdir, stdout=log,
                                stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    seconds = time.monotonic() - start
    per_test = outcomes(workdir, ranks)
    passed, failed, skipped = [], [], []
    for test, by_rank in sorted(per_test.items()):
        kinds = {by_rank.get(r, ("no result", ""))[0] for r in range(ranks)}
        if kinds == {"passed"}:
            passed.append(test)
        elif kinds == {"skipped"}:
            skipped.append((test, by_rank[0][1]))
        else:
            failed.append((test, {r: by_rank.get(r, ("no result", ""))[0] for r in range(ranks)}))
    ok = rc == 0 and not failed and len(per_test) > 0
    print(f"RaNNC test suite on {ranks} rank(s): {len(passed)} passed, {len(failed)} failed, "
          f"{len(skipped)} skipped in {seconds:.0f} s (mpirun exit {rc})", flush=True)
    for test, by_rank in failed:
        print(f"  FAILED {test}: {by_rank}")
    reasons = sorted({reason for _, reason in skipped})
    for reason in reasons:
        print(f"  skipped ({sum(1 for _, r in skipped if r == reason)}): {reason}")
    if not ok:
        with open(log_path) as f:
            tail = f.read()[-12000:]
        print(f"--- last lines of {log_path} ---\n{tail}", flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return ok, len(passed), len(failed), len(skipped)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per launch")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    if shutil.which("mpirun") is None:
        sys.exit("run_suite.py: mpirun is not installed (apt-get install openmpi-bin)")
    totals, all_ok = [0, 0, 0], True
    extensions = extensions_env()
    for ranks in [int(r) for r in args.ranks.split(",")]:
        ok, *counts = run(ranks, args.pytest_args, args.timeout, extensions)
        all_ok &= ok
        totals = [t + c for t, c in zip(totals, counts)]
    print(f"RaNNC test suite: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped "
          f"over {args.ranks} rank(s)", flush=True)
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
