"""``python -m bench.run ...``: the same as ``switchyard bench run ...``."""

from __future__ import annotations

import sys

from bench.run.cli import main

if __name__ == "__main__":
    sys.exit(main())
