"""Headroom for higher tiers: batch slots lower tiers may not take.

A stream that has started is never cancelled, so under overload a saturated fleet frees a
batch slot only when some answer ends: with every slot busy, an interactive request waits
for the next one to end, and a few interactive arrivals close together wait for several —
past a 0.5 s SLO. Strict priority in the gateway's queue is not enough; the slots have to be
free *before* the request arrives.

So a request of tier T is dispatched only while the fleet has more free batch slots than
``reserved_slots(T)``: ``factor`` times the requests of the tiers above T expected to arrive
within their own TTFT SLO, ``factor * sum(rate_t * ttft_slo_t)`` over those tiers, rounded to
the nearest whole slot but at least one, capped at ``max_share`` of the fleet's slots. The top
tier reserves nothing; a tier with no traffic above it reserves nothing, so without
interactive traffic nothing is held back.

Why ``factor`` 0.5 and the nearest slot (not 1.0 and the next one up): a saturated fleet also
frees slots while a higher-tier request waits (16 slots of ~1.5 s streams free one every
~0.1 s), and a held slot idles between arrivals, costing its share of the fleet's throughput.
Rounding up turned the noise of the rate estimate around a whole number (e.g. 2.0 expected
interactive arrivals at 2x overload in the admission benchmark) into an extra held slot half
the time. In the admission benchmark at 2x overload (capacity 10.67 req/s), factor 1.0
rounded up held 3 of 16 slots for goodput 0.85 of capacity; 0.5 to the nearest slot holds one,
for 0.90, with interactive attainment (0.95-0.98 of offered) within the run-to-run noise of
the larger reserve. Interactive misses there come from bursts of arrivals meeting a lull in
stream ends, which no reserve of this kind covers cheaply (docs/benchmarks.md, "Admission and
fairness"). Arrival rates
are exponentially weighted (time constant ``tau_s``), per tier, counted at arrival (admitted,
queued or rejected alike: the demand, not what was served).

Free slots come from the fleet snapshot: per healthy backend with fresh figures and an
advertised ``max_batch``, ``max_batch - holding - waiting`` (``BackendState.num_holding``: the
larger of running and in flight, less this gateway's streams on their last step), counted only on
backends the dispatcher would send to (``admission.policy.fleet_free_slots``). Counting the
others let a lower tier take the one slot the dispatcher could use while an interactive
request waited: a heartbeat that caught a request in a worker's queue keeps that worker
"without room" until the next one, yet its other free slot counted toward the reserve. A
backend that advertises no ``max_batch`` (a third-party engine) has unknown room: then
``free_slots`` is None and no headroom is kept (the saturation checks of
``admission.policy`` still apply).

Example::

    rates = ArrivalRates(tau_s=10.0)
    rates.arrived("interactive", now_s)
    reserve = reserved_slots(tiers["standard"], tiers.values(), rates, now_s,
                             total_slots=16)          # e.g. 1
    free, total = fleet_free_slots(snapshot)          # e.g. (2, 16): standard waits
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from admission.tiers import Tier
from routing.types import BackendState, FleetSnapshot


class ArrivalRates:
    """Exponentially weighted arrival rate per tier, in requests per second."""

    def __init__(self, tau_s: float = 10.0) -> None:
        if not (math.isfinite(tau_s) and tau_s > 0):
            raise ValueError(f"tau_s must be > 0, got {tau_s}")
        self.tau_s = tau_s
        self._level: dict[str, tuple[float, float]] = {}  # tier -> (rate at time, time)

    def arrived(self, tier: str, now_s: float) -> None:
        rate = self.rate(tier, now_s)
        self._level[tier] = (rate + 1.0 / self.tau_s, now_s)

    def rate(self, tier: str, now_s: float) -> float:
        level = self._level.get(tier)
        if level is None:
            return 0.0
        rate, then_s = level
        return rate * math.exp(-max(0.0, now_s - then_s) / self.tau_s)


def reserved_slots(tier: Tier, tiers: Iterable[Tier], rates: ArrivalRates, now_s: float, *,
                   total_slots: int, factor: float = 0.5, max_share: float = 0.25) -> int:
    """Free batch slots a request of ``tier`` must leave to the tiers above it."""
    if factor <= 0 or total_slots <= 0:
        return 0
    expected = sum(rates.rate(t.name, now_s) * t.ttft_slo_s for t in tiers
                   if t.priority < tier.priority)
    if expected <= 0:
        return 0
    return min(max(1, math.floor(factor * expected + 0.5 + 1e-9)), int(max_share * total_slots))


def backend_free_slots(backend: BackendState, *, max_age_s: float) -> int | None:
    """Batch slots ``backend`` could start a request in now; None when it does not say."""
    max_batch = backend.profile.max_batch
    if max_batch is None:
        return None
    if not backend.is_healthy or backend.age_s > max_age_s:
        return 0
    return max(0, max_batch - backend.num_holding - backend.num_waiting)


def free_slots(snapshot: FleetSnapshot, *, model: str | None = None,
               has_room: Callable[[BackendState], bool] | None = None
               ) -> tuple[int, int] | None:
    """(free, total) batch slots of the backends serving ``model`` (all, if None); None when
    one of them advertises no ``max_batch``, so the fleet's room is unknown.

    ``has_room``: only the free slots of backends it accepts count (``admission.policy``
    passes its capacity check, so that a slot on a backend the dispatcher will not send to —
    one with a request in its queue — is not counted as room for the reserve)."""
    free = total = 0
    for backend in snapshot.backends:
        if model is not None and model not in backend.models:
            continue
        room = backend_free_slots(backend, max_age_s=snapshot.max_age_s)
        if room is None:
            return None
        if room and (has_room is None or has_room(backend)):
            free += room
        total += backend.profile.max_batch or 0
    return free, total
