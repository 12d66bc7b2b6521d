"""The same short request every time: for measuring the load generator and the gateway
themselves, where prompt content does not matter. Example::

    next(generate(WorkloadOptions(), tenants, seed=1)).messages[0]["content"]
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from bench.run.spec import RequestSpec, TenantSpec
from bench.run.workloads.base import WorkloadOptions

PROMPT = "Say hello to the benchmark."


def generate(options: WorkloadOptions, tenants: Sequence[TenantSpec],
             seed: int) -> Iterator[RequestSpec]:
    """Request specs of this workload, without end (see the module docstring)."""
    if not tenants:
        raise ValueError("a workload needs at least one tenant")
    rng = random.Random(f"{seed}:fixed")
    index = 0
    while True:
        yield RequestSpec(
            index=index, tenant=rng.choice(tenants), max_tokens=options.max_tokens.low,
            messages=({"role": "user", "content": PROMPT},), is_stream=options.is_stream,
        )
        index += 1
