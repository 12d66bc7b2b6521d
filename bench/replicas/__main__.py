"""``python -m bench.replicas``: runs `bench.replicas.bench`."""

from bench.replicas.bench import main

raise SystemExit(main())
