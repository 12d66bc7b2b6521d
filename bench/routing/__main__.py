"""``python -m bench.routing``: runs `bench.routing.live`."""

from bench.routing.live import main

raise SystemExit(main())
