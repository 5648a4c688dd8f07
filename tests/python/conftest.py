"""Run with: PYTHONPATH=build/python /usr/bin/python3 -m pytest tests/python"""
import os
import sys

_build = os.path.join(os.path.dirname(__file__), "..", "..", "build", "python")
if os.path.isdir(_build) and _build not in sys.path:
    sys.path.insert(0, os.path.abspath(_build))
