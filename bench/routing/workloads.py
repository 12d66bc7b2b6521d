"""Shared-prefix groups with chosen popularity weights, for the hot-prefix experiment.

The same system prompts as ``bench.run`` 's shared-prefix workload for the same seed and
options (group ``g``'s prompt comes from ``sub_rng(seed, "system", g)``); only the group
popularity differs. ``hot_weights`` gives group 0 a fixed share of the traffic and spreads the
rest evenly; ``uniform_weights`` spreads all of it evenly. Example::

    specs = weighted_prefix(WorkloadOptions(), tenants, seed=1, weights=hot_weights(24, 0.3))
    sum(next(specs).group == 0 for _ in range(1000))   # about 300
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from backends.tokenizer import get_tokenizer
from bench.run.spec import RequestSpec, TenantSpec
from bench.run.text import sub_rng, text
from bench.run.workloads.base import WorkloadOptions, shuffled


def uniform_weights(num_groups: int) -> list[float]:
    """Every group equally popular."""
    return [1.0 / num_groups] * num_groups


def hot_weights(num_groups: int, hot_share: float) -> list[float]:
    """Group 0 carries ``hot_share`` of the traffic; the others share the rest evenly."""
    if num_groups < 2 or not 0 < hot_share < 1:
        raise ValueError("a hot prefix needs at least 2 groups and a share in (0, 1)")
    rest = (1.0 - hot_share) / (num_groups - 1)
    return [hot_share] + [rest] * (num_groups - 1)


def system_prompts(options: WorkloadOptions, num_groups: int, seed: int) -> list[str]:
    """The groups' system prompts, as ``bench.run`` 's shared-prefix workload draws them."""
    return [text(options.system_tokens.draw(sub_rng(seed, "system", g)),
                 sub_rng(seed, "system-text", g)) for g in range(num_groups)]


def working_set_blocks(options: WorkloadOptions, num_groups: int, seed: int,
                       block_size: int = 16) -> int:
    """KV blocks that hold every group's system prompt once (as the engine renders it): the
    shared part of the workload's working set."""
    tokenizer = get_tokenizer("approx")
    return sum(len(tokenizer.encode_chat([{"role": "system", "content": prompt}])) // block_size
               for prompt in system_prompts(options, num_groups, seed))


def weighted_prefix(options: WorkloadOptions, tenants: Sequence[TenantSpec], seed: int,
                    weights: Sequence[float]) -> Iterator[RequestSpec]:
    """Shared-prefix request specs, group ``g`` drawn with probability ``weights[g]``."""
    num_groups = len(weights)
    owners = shuffled(tenants, seed)
    prompts = system_prompts(options, num_groups, seed)
    groups = range(num_groups)
    rng = random.Random(f"{seed}:weighted-prefix")
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
