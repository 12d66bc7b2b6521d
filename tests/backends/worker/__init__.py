"""Tests of the PyTorch worker. They need PyTorch (the CPU build) and never skip without it."""

import importlib.util

if importlib.util.find_spec("torch") is None:
    raise ImportError(
        "the worker tests need PyTorch: install the CPU build with "
        "`.venv/bin/pip install torch==2.13.0` (scripts/setup.sh does it)"
    )
