"""The TTFT cost model: how long each backend would take to start answering this request.

It weighs what prefix affinity saves against the wait it causes, in one unit (seconds)::

    rate        = profile.prefill_tokens_per_s  (default 10,000 tok/s times profile.relative_speed)
    cached      = min(prompt, matched_blocks * block_tokens)      from snapshot.prefix
    uncached    = prompt - cached                                 this request's own prefill
    drained     = max(0, num_queued_prefill_tokens - rate * age_s)   the engine's backlog now
    backlog     = max(drained, num_in_flight_prompt_tokens)                        if fresh
                = worst queued_prefill among candidates + num_in_flight_prompt_tokens if stale
    ttft_s      = (backlog + uncached) / rate
    score       = (min_ttft_s + floor_s) / (ttft_s + floor_s)      1 for the quickest

The backlog is the prefill work queued ahead of the request. The engine reports it
(``num_queued_prefill_tokens``, ``age_s`` old, plus the snapshot's own age), and has worked
through ``rate * age_s`` of it since (``BackendState.queued_prefill_now``): a heartbeat up to
a second old otherwise counts a backlog already gone, and sends a prompt away from the backend
holding its prefix to recompute it elsewhere (``bench.replicas``' own-fleet misses,
``docs/benchmarks/replicas.md``). The gateway knows what it sent that has no first token yet
(``num_in_flight_prompt_tokens``, current). When fresh, the engine's figure already includes the
gateway's requests it has seen, so the larger of the two is the better estimate;
when stale, the engine figure is unknown and taken as the worst among the candidates, with the
gateway's own requests on top, so a stale backend is never idle but the gateway's own counts
still tell stale backends apart. ``floor_s`` (10 ms) keeps near-zero estimates from
exaggerating tiny differences.

So the holder of a hot prefix wins while ``backlog_holder + uncached_holder`` stays below
``backlog_other + prompt`` (scaled by each one's prefill speed); once its queue outgrows what
the cache saves, an idle backend that must recompute the prefix is quicker, it gets the
request, and from then on holds the prefix too: the hot prefix spreads instead of pinning one
worker (the failure of sglang's cache_aware router in ANCHORS.md).

Not modelled: decode steps sharing the batch with prefill, waiting for a free batch slot or KV
blocks (the ``not_saturated`` filter and the ``queue`` scorer cover those), network time.
Cost: O(backends) per call.

Example::

    scorer = TtftScorer(default_prefill_tokens_per_s=8_000)
    scorer.estimates_s(cycle, candidates)   # [0.31, 0.04, ...] seconds
    scorer.score(cycle, candidates)         # [0.16, 1.0, ...]
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.plugin import Cycle, check_number
from routing.registry import register_scorer
from routing.types import DEFAULT_PREFILL_TOKENS_PER_S, BackendState

DEFAULT_FLOOR_S = 0.01


@register_scorer("ttft")
class TtftScorer:
    """Scores the estimated time to first token, including the prefix cache's saving."""

    def __init__(self, default_prefill_tokens_per_s: object = DEFAULT_PREFILL_TOKENS_PER_S,
                 floor_s: object = DEFAULT_FLOOR_S) -> None:
        self.default_prefill_tokens_per_s = check_number(
            "default_prefill_tokens_per_s", default_prefill_tokens_per_s, above=0)
        self.floor_s = check_number("floor_s", floor_s, above=0)

    def estimates_s(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
        """The estimated TTFT of the request on each candidate, in seconds."""
        stale_after_s, snapshot_age_s = cycle.stale_after_s, cycle.snapshot_age_s
        worst_queued = 0
        if cycle.has_stale(candidates):
            worst_queued = max([b.num_queued_prefill_tokens for b in candidates])
        prefix = cycle.snapshot.prefix
        get_num_blocks = prefix.num_blocks.get
        block_tokens = prefix.block_tokens
        num_prompt_tokens = cycle.request.num_prompt_tokens
        default_rate = self.default_prefill_tokens_per_s
        estimates = []
        for b in candidates:
            in_flight = b.num_in_flight_prompt_tokens
            rate = b.profile.prefill_rate(default_rate)
            if b.age_s > stale_after_s:
                backlog = worst_queued + in_flight
            else:
                backlog = b.queued_prefill_now(rate, snapshot_age_s)
                if in_flight > backlog:
                    backlog = in_flight
            uncached = num_prompt_tokens - get_num_blocks(b.name, 0) * block_tokens
            estimates.append((backlog + (uncached if uncached > 0 else 0)) / rate)
        return estimates

    def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
        estimates = self.estimates_s(cycle, candidates)
        floor_s = self.floor_s
        best = min(estimates) + floor_s
        return [best / (t + floor_s) for t in estimates]
