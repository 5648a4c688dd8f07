"""Run with: /usr/bin/python3 -m pytest tests/zoo (scripts/test does; BUILD_UNDER_TEST picks the
build, as for tests/python)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))  # mpi_launch
sys.path.insert(0, HERE)
from mpi_launch import BUILD_PYTHON  # noqa: E402

if os.path.isdir(BUILD_PYTHON) and BUILD_PYTHON not in sys.path:
    sys.path.insert(0, BUILD_PYTHON)
