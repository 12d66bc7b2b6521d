"""The built-in prefix and load scorers; each returns one score in [0, 1] per candidate.

Load figures come in two kinds. The gateway's own counts (``num_in_flight*``) are always
current. The engine's (``num_waiting``, ``kv_usage``, ``num_queued_prefill_tokens``) are
``age_s`` old; when a backend is stale (``Cycle.is_stale``) they are unknown, and
:func:`worst_if_stale` replaces them with the worst value among the candidates, so a stale
backend is scored as loaded, never as idle. Each scorer is O(backends).

Example config::

    scorers:
      - {type: prefix, weight: 1}
      - {type: queue, weight: 1}
      - {type: kv_usage, weight: 0.5}
      - {type: in_flight_tokens, weight: 0.5}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from routing.plugin import Cycle
from routing.registry import register_scorer
from routing.types import BackendState

_Number = TypeVar("_Number", int, float)


def worst_if_stale(cycle: Cycle, candidates: Sequence[BackendState],
                   observed: list[_Number]) -> list[_Number]:
    """``observed`` (one engine figure per candidate) with each stale backend's replaced by the
    largest among all candidates: unknown load is taken to be as bad as the worst seen.

    Example::

        worst_if_stale(cycle, [fresh_idle, stale], [0.0, 0.0])  # [0.0, 0.0]: nothing worse seen
        worst_if_stale(cycle, [fresh_busy, stale], [9.0, 0.0])  # [9.0, 9.0]
    """
    if not cycle.has_stale(candidates):
        return observed
    stale_after_s = cycle.stale_after_s
    worst = max(observed)
    return [worst if b.age_s > stale_after_s else value
            for b, value in zip(candidates, observed, strict=True)]


@register_scorer("prefix")
class PrefixScorer:
    """The fraction of the request's blocks a backend already holds (from ``snapshot.prefix``).

    The denominator is the request's token-block chain for an exact match and its character-
    block chain for an approximate one.
    """

    def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
        prefix = cycle.snapshot.prefix
        request = cycle.request
        num_request_blocks = len(request.block_hashes if prefix.is_exact else request.char_hashes)
        if num_request_blocks == 0 or not prefix.num_blocks:
            return [0.0] * len(candidates)
        get = prefix.num_blocks.get
        return [get(b.name, 0) / num_request_blocks for b in candidates]


@register_scorer("queue")
class QueueScorer:
    """Shorter queues score higher: ``(1 + least) / (1 + load)`` with ``load`` the engine's
    waiting requests plus this gateway's in-flight ones; the least loaded scores 1.
    """

    def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
        if cycle.has_stale(candidates):
            waiting = worst_if_stale(cycle, candidates, [b.num_waiting for b in candidates])
            loads = [1.0 + w + b.num_in_flight for b, w in zip(candidates, waiting, strict=True)]
        else:
            loads = [1.0 + b.num_waiting + b.num_in_flight for b in candidates]
        least = min(loads)
        return [least / load for load in loads]


@register_scorer("kv_usage")
class KvUsageScorer:
    """Free KV cache scores higher: ``1 - kv_usage``."""

    def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
        usage = worst_if_stale(cycle, candidates, [b.kv_usage for b in candidates])
        return [1.0 - u for u in usage]


@register_scorer("in_flight_tokens")
class InFlightTokensScorer:
    """Fewer tokens in flight from this gateway scores higher: ``1 - tokens / most``."""

    def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
        tokens = [b.num_in_flight_tokens for b in candidates]
        most = max(tokens)
        if most <= 0:
            return [1.0] * len(candidates)
        return [1.0 - t / most for t in tokens]
