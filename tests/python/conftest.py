"""Run with: /usr/bin/python3 -m pytest tests/python (build/), or BUILD_UNDER_TEST=build-torch2
.venv-torch2/bin/python -m pytest tests/python (scripts/test's PyTorch 2.x leg)."""
import os
import sys

from mpi_launch import BUILD_PYTHON

if os.path.isdir(BUILD_PYTHON) and BUILD_PYTHON not in sys.path:
    sys.path.insert(0, BUILD_PYTHON)

# These tests check results, not timings: no minimum span for the profiler's timing passes
# (Note [Measurement passes] in profiler/node_runner.h), as mpi_launch.mpi_env sets for ranks.
os.environ.setdefault("AUTOSTAGE_PROFILE_PASS_SECONDS", "0")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "leg_independent: checks nothing the torch build changes (MPI faults between "
        "hosts and ranks, the planning service's store, the CLI's plans of synthetic specs); "
        "scripts/test runs it on its first leg only (-m 'not leg_independent' on the next)")
