"""``python -m backends.mock``: run the mock engine."""

from __future__ import annotations

import sys

from backends.mock.cli import main

sys.exit(main())
