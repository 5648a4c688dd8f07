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
