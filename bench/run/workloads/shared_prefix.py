"""Shared-prefix groups: G system prompts, each asked many unique questions.

Group ``g`` has one system prompt (``system_tokens`` long) and belongs to one tenant; groups
are chosen with Zipf popularity (group 0 the most popular); every question is unique
(``question_tokens`` long). This is ANCHORS.md's routing workload with the defaults and one
group per tenant. Example::

    specs = generate(WorkloadOptions(), tenants, seed=1)
    next(specs).messages[0]["content"][:20]   # group 7's system prompt
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from bench.run.spec import RequestSpec, TenantSpec
from bench.run.text import sub_rng, text
from bench.run.workloads.base import WorkloadOptions, shuffled, zipf_weights


def generate(options: WorkloadOptions, tenants: Sequence[TenantSpec],
             seed: int) -> Iterator[RequestSpec]:
    """Request specs of this workload, without end (see the module docstring)."""
    num_groups = options.num_groups or len(tenants)
    owners = shuffled(tenants, seed)
    prompts = [text(options.system_tokens.draw(sub_rng(seed, "system", g)),
                    sub_rng(seed, "system-text", g)) for g in range(num_groups)]
    weights = zipf_weights(num_groups, options.zipf_s)
    groups = range(num_groups)
    rng = random.Random(f"{seed}:shared-prefix")
    index = 0
    while True:
        group = rng.choices(groups, weights)[0]
        question = text(options.question_tokens.draw(rng), rng)
        yield RequestSpec(
            index=index, tenant=owners[group % len(owners)],
            max_tokens=options.max_tokens.draw(rng),
            messages=({"role": "system", "content": prompts[group]},
                      {"role": "user", "content": question}),
            is_stream=options.is_stream, group=group,
        )
        index += 1
