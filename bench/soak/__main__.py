"""``python -m bench.soak``: runs `bench.soak.bench`."""

from bench.soak.bench import main

raise SystemExit(main())
