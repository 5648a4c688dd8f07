"""Run with: /usr/bin/python3 -m pytest tests/zoo (scripts/test does)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))  # mpi_launch
sys.path.insert(0, HERE)
_build = os.path.abspath(os.path.join(HERE, "..", "..", "build", "python"))
if os.path.isdir(_build) and _build not in sys.path:
    sys.path.insert(0, _build)
