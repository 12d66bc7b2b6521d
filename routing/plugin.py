"""The three plugin seams of a scheduling profile — Filter, Scorer, Picker — and their inputs.

The endpoint-picker model of the Gateway API Inference Extension / llm-d: filters drop backends
that must not get the request, scorers rate each remaining backend in [0, 1], and a picker
chooses one from the weighted sums. Plugins are pure: they read a :class:`Cycle` (the request,
the snapshot and ``now_s``) and return values; the framework (``routing.scheduler``) clamps,
weighs and records each scorer's contribution, so a plugin never builds reasons itself.

A plugin is a class registered by type name (``routing.registry``) whose keyword arguments are
its YAML settings::

    @register_scorer("idle")
    class IdleScorer:
        def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
            return [1.0 if b.num_in_flight == 0 else 0.0 for b in candidates]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from random import Random
from typing import ClassVar, Protocol

from routing.types import BackendState, FleetSnapshot, RouteRequest


class Cycle:
    """One ``schedule()`` call's inputs, shared by every plugin of the call.

    ``stale_after_s`` folds the snapshot's own age (``snapshot_age_s``) into the freshness
    bound: a backend whose figures were ``age_s`` old when the snapshot was taken is
    ``age_s + (now_s - snapshot.now_s)`` old now, and is stale when that exceeds
    ``snapshot.max_age_s``.

    Example::

        cycle = Cycle(request, snapshot, now_s=12.0)
        fresh = [b for b in snapshot.backends if not cycle.is_stale(b)]
    """

    __slots__ = ("_has_stale", "_stale_checked", "now_s", "request", "snapshot", "snapshot_age_s",
                 "stale_after_s")

    def __init__(self, request: RouteRequest, snapshot: FleetSnapshot, now_s: float) -> None:
        self.request = request
        self.snapshot = snapshot
        self.now_s = now_s
        self.snapshot_age_s = max(0.0, now_s - snapshot.now_s)
        self.stale_after_s = snapshot.max_age_s - self.snapshot_age_s
        self._stale_checked: Sequence[BackendState] | None = None
        self._has_stale = False

    def is_stale(self, backend: BackendState) -> bool:
        """Load figures too old to trust: the backend is unknown, never idle."""
        return backend.age_s > self.stale_after_s

    def has_stale(self, candidates: Sequence[BackendState]) -> bool:
        """Whether any of ``candidates`` is stale; remembered for the list last asked about,
        as every scorer of a call asks about the same one."""
        if candidates is not self._stale_checked:
            self._stale_checked = candidates
            stale_after_s = self.stale_after_s
            self._has_stale = any(b.age_s > stale_after_s for b in candidates)
        return self._has_stale

    def num_cached_tokens(self, backend: BackendState) -> int:
        """Prompt tokens ``backend`` is expected to hold already, from the snapshot's match."""
        prefix = self.snapshot.prefix
        num_blocks = prefix.num_blocks.get(backend.name, 0)
        return min(self.request.num_prompt_tokens, num_blocks * prefix.block_tokens)


class Filter(Protocol):
    """Keeps the candidates that pass (a new list, maybe empty; the input is not changed).

    ``soft``: when a soft filter passes nobody, ``schedule()`` keeps every candidate instead of
    leaving the request nowhere to go; a hard filter's empty list means no backend can take it.
    """

    soft: ClassVar[bool]

    def filter(self, cycle: Cycle, candidates: list[BackendState]) -> list[BackendState]: ...


class Scorer(Protocol):
    """One score per candidate, in order; the framework clamps each to [0, 1]."""

    def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]: ...


class Picker(Protocol):
    """The index of the chosen candidate, given each candidate's weighted total score."""

    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float],
             rng: Random) -> int: ...


def check_number(key: str, value: object, *, minimum: float | None = None,
                 above: float | None = None, maximum: float | None = None) -> float:
    """A plugin setting as a finite float, or a ValueError that names ``key``.

    Example::

        check_number("max_waiting", 64, minimum=0)    # 64.0
        check_number("temperature", 0, above=0)       # ValueError: temperature must be > 0
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{key} must be finite, got {value!r}")
    if minimum is not None and number < minimum:
        raise ValueError(f"{key} must be >= {minimum:g}, got {value!r}")
    if above is not None and number <= above:
        raise ValueError(f"{key} must be > {above:g}, got {value!r}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{key} must be <= {maximum:g}, got {value!r}")
    return number


def below(rng: Random, n: int) -> int:
    """``rng.randrange(n)``, the same draws from the same stream (``Random._randbelow``: the
    bits of ``n``, drawn again until under it), without randrange's three interpreted frames:
    compiled, one C call per draw. ``n`` > 0."""
    k = n.bit_length()
    r = rng.getrandbits(k)
    while r >= n:
        r = rng.getrandbits(k)
    return r
