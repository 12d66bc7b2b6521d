"""The built-in filters: who may get a request at all.

Hard filters (``model``, ``healthy``, ``resources``) drop every backend that fails them, even
the last one: sending there would fail anyway. Soft filters (``fresh``, ``not_saturated``,
``balanced``; ``soft = True``) prefer better backends but never leave the request with nowhere
to go: when nobody passes, ``schedule()`` keeps every candidate and the load scorers
(``routing.plugins.scorers``) rate the stale or saturated ones as loaded. Every filter returns only
the backends that pass (the fallback is the scheduler's, so a shortlist can tell "none of
these" from "none at all", ``routing.shortlist``). Each is one pass over the candidates,
O(backends).

Example config::

    filters:
      - {type: model}
      - {type: healthy}
      - {type: fresh}
      - {type: resources}
      - {type: not_saturated, max_waiting: 64, max_kv_usage: 0.98}
      - {type: balanced, max_ratio: 2, max_excess: 32}
"""

from __future__ import annotations

from typing import ClassVar

from routing.fit import fits, holds, needed_kv_tokens
from routing.plugin import Cycle, check_number
from routing.registry import register_filter
from routing.types import BackendState


@register_filter("model")
class ModelFilter:
    """Backends that serve the requested model."""

    soft: ClassVar[bool] = False

    def filter(self, cycle: Cycle, candidates: list[BackendState]) -> list[BackendState]:
        model = cycle.request.model
        return [b for b in candidates if model in b.models]


@register_filter("healthy")
class HealthyFilter:
    """Backends whose health checks pass."""

    soft: ClassVar[bool] = False

    def filter(self, cycle: Cycle, candidates: list[BackendState]) -> list[BackendState]:
        return [b for b in candidates if b.is_healthy]


@register_filter("fresh")
class FreshFilter:
    """Backends whose load figures are at most ``snapshot.max_age_s`` old.

    A stale backend is unknown, never idle: it is dropped while any fresh one remains. When none
    is fresh all are kept (soft: the request must go somewhere) and scorers treat them as
    loaded.
    """

    soft: ClassVar[bool] = True

    def filter(self, cycle: Cycle, candidates: list[BackendState]) -> list[BackendState]:
        stale_after_s = cycle.stale_after_s
        return [b for b in candidates if b.age_s <= stale_after_s]


@register_filter("not_saturated")
class NotSaturatedFilter:
    """Drops backends with a long waiting queue or no room for the request's KV, unless that
    drops them all (soft).

    Room is the fit rule (``routing.fit``): the KV the request needs there (its uncached
    prompt tokens and expected output, so a prefix holder needs only what it lacks) against
    the KV free there (capacity from the profile, less the gauge's usage and this gateway's
    not-yet-prefilled prompts). A backend whose KV capacity is unknown falls back on
    ``max_kv_usage``, a last guard that never drops a backend holding part of the prompt:
    engines' gauges sit near 1.0 under long-context load, and a holder needs little new KV.
    A stale backend counts as saturated (its load is unknown).
    """

    soft: ClassVar[bool] = True

    def __init__(self, max_waiting: object = 64, max_kv_usage: object = 0.98) -> None:
        self.max_waiting = check_number("max_waiting", max_waiting, minimum=0)
        self.max_kv_usage = check_number("max_kv_usage", max_kv_usage, minimum=0, maximum=1)

    def filter(self, cycle: Cycle, candidates: list[BackendState]) -> list[BackendState]:
        stale_after_s = cycle.stale_after_s
        max_waiting, max_kv_usage = self.max_waiting, self.max_kv_usage
        request = cycle.request
        kept = []
        for b in candidates:
            if b.age_s > stale_after_s or b.num_waiting > max_waiting:
                continue
            cached = cycle.num_cached_tokens(b)
            room = fits(b, needed_kv_tokens(request.num_prompt_tokens, cached,
                                            request.max_tokens), max_age_s=stale_after_s)
            if room is None:
                room = b.kv_usage <= max_kv_usage or cached > 0
            if room:
                kept.append(b)
        return kept


@register_filter("balanced")
class BalancedFilter:
    """Drops backends far busier than the least busy candidate, unless that drops them all
    (soft): ``load > max_ratio * least`` and ``load > least + max_excess``, with ``load`` the
    engine's waiting requests plus this gateway's in-flight ones (as the ``queue`` scorer).

    The TTFT estimate (``routing.plugins.ttft``) sees a holder's prefill backlog, not its decode
    batch: cache hits add almost no backlog, so a hot prefix's holders keep winning however
    many requests they run, and the set of holders stays whatever it was when the prefix got
    hot. This guard sends the request elsewhere once a holder runs both ``max_ratio`` times
    and ``max_excess`` more than the least loaded; the prefix then spreads to the backend that
    gets it. (sglang's cache-aware router has the same kind, with 64 more and 1.5 times as its
    defaults, which ANCHORS.md saw never fire.) A stale backend's waiting count is unknown; it
    counts its in-flight requests only (``fresh`` prefers fresh ones anyway).
    """

    soft: ClassVar[bool] = True

    def __init__(self, max_ratio: object = 2.0, max_excess: object = 32) -> None:
        self.max_ratio = check_number("max_ratio", max_ratio, minimum=1)
        self.max_excess = check_number("max_excess", max_excess, minimum=0)

    def filter(self, cycle: Cycle, candidates: list[BackendState]) -> list[BackendState]:
        stale_after_s = cycle.stale_after_s
        loads = [b.num_in_flight + (b.num_waiting if b.age_s <= stale_after_s else 0)
                 for b in candidates]
        if not loads:
            return []
        least = min(loads)
        limit = max(self.max_ratio * least, least + self.max_excess)
        if max(loads) <= limit:  # the common case: nobody is far busier
            return list(candidates)
        return [b for b, load in zip(candidates, loads, strict=True) if load <= limit]


@register_filter("resources")
class ResourcesFilter:
    """Backends whose advertised profile can hold the whole request (``routing.fit.holds``).

    Needs ``max_context_tokens >= prompt + max_tokens`` and a KV cache of at least
    ``ceil((prompt + max_tokens) / block_size)`` blocks. A limit the backend does not advertise
    does not filter. When the prompt's size is only estimated from its characters
    (``RouteRequest.is_exact_count`` false) and no backend passes, all are kept: the engines,
    which count exactly, decide (and answer their own ``context_length_exceeded``).
    """

    soft: ClassVar[bool] = False

    def filter(self, cycle: Cycle, candidates: list[BackendState]) -> list[BackendState]:
        request = cycle.request
        num_tokens = request.num_prompt_tokens + (request.max_tokens or 0)
        kept = [backend for backend in candidates if holds(backend.profile, num_tokens)]
        if not kept and not request.is_exact_count:
            return list(candidates)
        return kept
