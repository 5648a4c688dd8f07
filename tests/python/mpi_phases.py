"""Rank side of mpi_launch.run_phases: `mpi_phases.py LOGDIR SCRIPT PHASE...` runs test driver
SCRIPT (tests/python/*_job.py) once per PHASE in this one launch, as `SCRIPT PHASE` would run
alone, saving each phase the start of Python, torch and MPI on every rank (measured on this
machine's 2 cores: 1.3 s on 2 ranks and 2.8 s on 4 with LibTorch 1.13; 4.4 s on 4 with 2.11, and
5.4 s on 2 with transformers too).

Each phase runs in fresh globals (runpy) and the process-wide options as they were before the
first phase, its rank's output (Python's and LibTorch's, file descriptors 1 and 2) going to
LOGDIR/PHASE.RANK.log and its exit status (the driver's mpi_launch.finish ends it with
SystemExit) to LOGDIR/PHASE.RANK.status. An exception a phase raises ends the launch there, as it
would end the phase's own launch; the phases after it leave no status, which the test side
reports."""
import ctypes
import os
import runpy
import sys

import autostage
from autostage import _autostage

libc = ctypes.CDLL(None)


def flush():
    sys.stdout.flush()
    sys.stderr.flush()
    libc.fflush(None)  # LibTorch's and the logger's C streams


def run(script, phase, log_path):
    """Runs `script phase` with its output in log_path; returns its exit status."""
    saved = os.dup(1), os.dup(2)
    with open(log_path, "w") as log:
        flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            sys.argv = [script, phase]
            runpy.run_path(script, run_name="__main__")
            return 0
        except SystemExit as exit:
            return exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        finally:
            flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def options():
    """The process-wide options (autostage.Module's keyword arguments set them: Note [Per-module
    plan options] in driver/plan_sources.cpp), key -> value in TOML form."""
    return dict(line.split("  (")[0].split(" = ", 1)
                for line in _autostage.show_config().splitlines() if " = " in line)


def main():
    logdir, script, *phases = sys.argv[1:]
    rank = autostage.get_rank()
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    before = options()
    for phase in phases:
        base = os.path.join(logdir, f"{phase}.{rank}")
        status = run(script, phase, base + ".log")
        for key, value in options().items():  # as a launch of its own would leave them
            if before.get(key, value) != value:
                _autostage._set_option(key, before[key])
        with open(base + ".status", "w") as f:
            f.write(str(status))
        autostage.barrier()  # every rank done with the phase before the next begins
        print(f"rank {rank}: phase {phase} ended with status {status}", flush=True)


if __name__ == "__main__":
    main()
