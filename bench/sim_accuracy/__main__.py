"""``python -m bench.sim_accuracy``: runs `bench.sim_accuracy.bench`."""

from bench.sim_accuracy.bench import main

raise SystemExit(main())
