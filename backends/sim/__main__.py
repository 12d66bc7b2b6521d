"""`python -m backends.sim ...` is `switchyard sim ...`."""

import sys

from backends.sim.cli import main

sys.exit(main())
