"""``python -m bench.faults``: runs `bench.faults.bench`."""

from bench.faults.bench import main

raise SystemExit(main())
