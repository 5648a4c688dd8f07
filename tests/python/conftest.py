"""Run with: PYTHONPATH=build/python /usr/bin/python3 -m pytest tests/python"""
import os
import sys

_build = os.path.join(os.path.dirname(__file__), "..", "..", "build", "python")
if os.path.isdir(_build) and _build not in sys.path:
    sys.path.insert(0, os.path.abspath(_build))

# These tests check results, not timings: no minimum span for the profiler's timing passes
# (Note [Measurement passes] in profiler/node_runner.h), as mpi_launch.mpi_env sets for ranks.
os.environ.setdefault("AUTOSTAGE_PROFILE_PASS_SECONDS", "0")
