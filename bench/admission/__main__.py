"""``python -m bench.admission``: runs `bench.admission.bench`."""

from bench.admission.bench import main

raise SystemExit(main())
