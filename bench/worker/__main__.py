"""``python -m bench.worker``: runs `bench.worker.bench`."""

from bench.worker.bench import main

raise SystemExit(main())
