"""`python -m gateway ...` is `switchyard ...`."""

import sys

from gateway.cli.commands import main

sys.exit(main())
