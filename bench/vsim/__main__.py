"""``python -m bench.vsim``: see ``bench.vsim.cli``."""

from __future__ import annotations

from bench.vsim.cli import main

raise SystemExit(main())
