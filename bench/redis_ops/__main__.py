"""``python -m bench.redis_ops``: runs `bench.redis_ops.bench`."""

from bench.redis_ops.bench import main

raise SystemExit(main())
