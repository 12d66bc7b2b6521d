"""``python -m bench.overhead``: runs `bench.overhead.bench`."""

from bench.overhead.bench import main

raise SystemExit(main())
