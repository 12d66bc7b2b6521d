"""SLO-class admission: admit, queue fairly, or refuse early; the waiting room for overload.

The decision is ``admission.policy.decide`` (pure) on the same fleet snapshot routing uses.
Queued requests wait here, in ``admission.FairQueue`` (strict priority across tiers with a
guaranteed share for lower ones, token-weighted fairness across tenants within a tier), and a
dispatcher releases them while the fleet has capacity, so overload waits in the gateway, where
it can be ordered, instead of in the workers' FIFO queues. A request whose deadline passes in
the queue is refused before any upstream work; a client that leaves is dropped from the
queue. The TTFT predictor learns from every streamed first token.

The snapshot admission decides on is corrected for the streams seen to end after a worker's
last heartbeat was made (``admission.finishes``): without that, a slot held free for
interactive traffic looked busy for up to a heartbeat interval after each registry poll.

What it needs of the fleet is ``FleetView`` (the gateway's router is one); of a request,
``Admissible`` (the gateway's ``RoutePlan`` is one); of its sender, ``Caller``. It imports
nothing of the gateway: a refusal is an ``AdmissionRefused`` with a reason code, which the
gateway answers as its 503.

Example::

    slo = SloAdmission(tiers, router)
    tier = slo.tier_for(tenant_tier, key_tier, requested)  # raises admission.tiers.TierError
    admitted = await slo.admit(tier, tenant, plan, request_id)  # or raises AdmissionRefused
    try:
        ...  # route on admitted.snapshot; at a stream's first token:
        slo.observe_first_token(admitted, backend, snapshot, uncached_tokens, ttft_s)
    finally:
        slo.finished(admitted, actual_tokens)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from admission.fair_queue import FairQueue, FairQueueConfig, QueueEntry
from admission.finishes import RecentFinishes
from admission.headroom import ArrivalRates, reserved_slots
from admission.policy import (
    AdmissionRequest,
    Reason,
    decide,
    fleet_free_slots,
    fleet_has_capacity,
    reject_expired,
)
from admission.predictor import TtftPredictor, snapshot_features
from admission.retry_book import RetryBook, retry_key
from admission.sfq import charge_of
from admission.tiers import Tier, TierConfig, resolve_tier, tier_table
from routing.types import BackendState, FleetSnapshot, RouteRequest

log = logging.getLogger(__name__)
_ENDS = "all"  # the one key of SloAdmission.ends


class FleetView(Protocol):
    """The fleet as routing sees it (the gateway's ``Router``; the simulator's own)."""

    def fleet_snapshot(self, now_s: float) -> FleetSnapshot: ...

    def snapshot(self, request: RouteRequest, now_s: float) -> FleetSnapshot: ...

    def num_running_reported(self, backend: str) -> int | None:
        """What the engine last reported running (None: no such backend)."""
        ...

    def route(self, plan: Admissible, snapshot: FleetSnapshot, now_s: float
              ) -> Sequence[BackendState]:
        """Routing's decision for ``plan`` on ``snapshot``, kept for when it goes upstream;
        the backends it scored (admission predicts over those)."""
        ...


class Admissible(Protocol):
    """A request as admission judges it: what routing knows of it and the tokens it may use."""

    @property
    def request(self) -> RouteRequest: ...

    @property
    def reserved_tokens(self) -> int: ...


class Caller(Protocol):
    """Whose request it is: the tenant's id and its weight in its tier's fair share."""

    @property
    def id(self) -> str: ...

    @property
    def weight(self) -> float: ...


@dataclass(slots=True, init=False)
class Admitted:
    """One request's passage through admission, handed back at its first token and its end.

    ``snapshot`` is the corrected fleet the decision saw (routing reuses it; None when
    admission did not look); ``tier`` is set while it counts as running in its tier."""

    tenant: str
    snapshot: FleetSnapshot | None
    snapshot_taken_s: float
    tier: str | None
    charged_tokens: int
    backend: str | None  # where its stream got its first token

    def __init__(self, tenant: str, snapshot: FleetSnapshot | None = None,
                 snapshot_taken_s: float = 0.0, tier: str | None = None, charged_tokens: int = 0,
                 backend: str | None = None) -> None:
        self.tenant = tenant
        self.snapshot = snapshot
        self.snapshot_taken_s = snapshot_taken_s
        self.tier = tier
        self.charged_tokens = charged_tokens
        self.backend = backend


class AdmissionRefused(Exception):
    """The request may not go upstream now: ``code`` says why (a bounded label), ``reason``
    says it with figures, ``retry_after_s`` when to come back."""

    def __init__(self, tier: Tier, code: Reason, reason: str,
                 retry_after_s: float | None) -> None:
        super().__init__(reason)
        self.tier = tier
        self.code = code
        self.reason = reason
        self.retry_after_s = max(1, round(retry_after_s or 1))


class SloAdmission:
    def __init__(self, tiers: Iterable[Tier | TierConfig], fleet: FleetView, *,
                 is_enabled: bool = True, tick_s: float = 0.01,
                 queue_config: FairQueueConfig | None = None, headroom_factor: float = 0.5,
                 headroom_max_share: float = 0.25) -> None:
        self.tiers = tier_table(tiers)
        self._ranked = sorted(self.tiers.values(), key=lambda t: t.priority)  # top tier first
        self.arrivals = ArrivalRates()
        self.headroom_factor = headroom_factor
        self.headroom_max_share = headroom_max_share
        self.fleet = fleet
        self.is_enabled = is_enabled
        self.queue = FairQueue(self.tiers.values(), queue_config)
        self.predictor = TtftPredictor()
        self.finishes = RecentFinishes()
        self.ends = ArrivalRates(tau_s=5.0)  # requests ending: how fast slots free (Retry-After)
        self.starts = ArrivalRates(tau_s=5.0)  # requests admitted, per tier (retry booking)
        self._waiters: dict[str, asyncio.Future[None]] = {}
        # Requests admitted and not yet finished, per tier: the floor of batch slots a
        # backlogged lower tier is owed (``owed_tier``).
        self.num_running_by_tier: dict[str, int] = dict.fromkeys(self.tiers, 0)
        self.lower_tier_share = (queue_config or FairQueueConfig()).lower_tier_share
        self.retries = RetryBook()  # refusals' booked returns (admission/retry_book.py)
        self._wakeup = asyncio.Event()
        self._tick_s = tick_s
        self.num_rejected: dict[Reason, int] = {}
        self.num_queued = 0

    # -- per request ----------------------------------------------------------------------
    def tier_for(self, tenant_tier: str, key_tier: str | None, requested: str | None) -> Tier:
        """The tier a request runs in (``admission.tiers.resolve_tier``; raises its errors)."""
        return resolve_tier(self.tiers, tenant_tier, key_tier, requested)

    async def admit(self, tier: Tier, caller: Caller, plan: Admissible, request_id: str,
                    body: bytes | None = None) -> Admitted:
        """Return when the request may go upstream, with the snapshot it was admitted on;
        raise ``AdmissionRefused`` when it may not.

        ``body``: the request's bytes, which with the tenant identify it when it comes back
        after a refusal's ``Retry-After`` (``admission.retry_book``): a request back in time
        goes to the front of its tier's queue."""
        admitted = Admitted(caller.id)
        if not self.is_enabled:
            return admitted
        route = plan.request
        now_s = time.monotonic()
        # The body is hashed only when some ticket is out or the request is refused.
        key = (retry_key(caller.id, body)
               if body is not None and len(self.retries) else None)
        is_returning = key is not None and self.retries.redeem(key, now_s) is not None
        snapshot = self._snapshot(now_s, route)
        if not any(b.is_healthy for b in snapshot.backends):
            return admitted  # nothing to wait for: routing answers 503 no_healthy_backend
        request = AdmissionRequest(tier=tier, tenant=caller.id,
                                   prompt_tokens=route.num_prompt_tokens, model=route.model,
                                   arrival_s=now_s, max_tokens=route.max_tokens)
        self.arrivals.arrived(tier.name, now_s)
        shortlist = self.fleet.route(plan, snapshot, now_s)
        decision = decide(request, snapshot, self.predictor, now_s, shortlist=shortlist,
                          num_queued_ahead=self.queue.num_ahead(tier) if len(self.queue) else 0,
                          reserved_slots=self.reserved_slots(tier, snapshot, now_s, route.model)
                          + self.owed_slots_below(tier, snapshot),
                          slot_free_rate_per_s=self.ends.rate(_ENDS, now_s))
        if decision.action == "admit":
            admitted.snapshot, admitted.snapshot_taken_s = snapshot, now_s
            # Charged to the tenant's fair order as a dispatch is (bounded): the moments the
            # tier's queue runs empty under overload otherwise go free to whoever sends most.
            self._started(admitted, tier, self.queue.charge_direct(
                caller.id, plan.reserved_tokens, tier.name, caller.weight))
            return admitted
        deadline_s = decision.deadline_s
        if is_returning:
            # Back when its refusal said: it waits at the front of its tier, for its tier's
            # usual wait (a tier that never queues: its TTFT SLO), whatever the prediction.
            deadline_s = now_s + max(tier.max_wait_s, tier.ttft_slo_s)
        elif decision.action == "reject":
            raise self._refused(tier, decision.code, decision.reason, decision.retry_after_s,
                                caller.id, body, now_s)
        entry = QueueEntry(entry_id=request_id, tenant=caller.id, tier=tier.name,
                           cost_tokens=plan.reserved_tokens, arrival_s=now_s,
                           deadline_s=deadline_s, weight=caller.weight)
        if request_id in self.queue or not self.queue.push(entry, now_s,
                                                           is_front=is_returning):
            raise self._refused(tier, "queue_full", "the admission queue is full", 1.0,
                                caller.id, body, now_s)
        self.num_queued += 1
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = waiter
        self._wakeup.set()
        try:
            await waiter
        except _Expired as expired:
            raise self._refused(tier, "deadline", expired.reason, expired.retry_after_s,
                                caller.id, body, time.monotonic()) from None
        finally:
            self._waiters.pop(request_id, None)
            self.queue.remove(request_id)  # no-op once dispatched; the client may have left
        # Routing runs before the handler's next await and reuses this (the corrected figures).
        now_s = time.monotonic()
        admitted.snapshot, admitted.snapshot_taken_s = self._snapshot(now_s, route), now_s
        self._started(admitted, tier, charge_of(plan.reserved_tokens))  # what dispatch charged
        return admitted

    def _refused(self, tier: Tier, code: Reason, reason: str, retry_after_s: float | None,
                 tenant: str, body: bytes | None, now_s: float) -> AdmissionRefused:
        """The refusal, counted, its return booked when the request can be known again."""
        self.num_rejected[code] = self.num_rejected.get(code, 0) + 1
        if body is not None:
            key = retry_key(tenant, body)
            # Returns are booked against how fast this tier's requests start lately (they
            # leave the front of its queue no faster); the fleet's ends before any started.
            rate = self.starts.rate(tier.name, now_s) or self.ends.rate(_ENDS, now_s)
            retry_after_s = self.retries.issue(key, tier.name, now_s, retry_after_s or 1.0,
                                               rate_per_s=rate)
        return AdmissionRefused(tier, code, reason, retry_after_s)

    def _started(self, admitted: Admitted, tier: Tier, charged_tokens: int) -> None:
        self.starts.arrived(tier.name, time.monotonic())
        admitted.tier, admitted.charged_tokens = tier.name, charged_tokens
        self.num_running_by_tier[tier.name] += 1

    def _snapshot(self, now_s: float, request: RouteRequest | None = None) -> FleetSnapshot:
        """The fleet as routing sees it, less the streams seen ending after each heartbeat."""
        snapshot = (self.fleet.fleet_snapshot(now_s) if request is None
                    else self.fleet.snapshot(request, now_s))
        return self.finishes.correct(snapshot, self.fleet.num_running_reported)

    def observe_first_token(self, admitted: Admitted | None, backend: str,
                            snapshot: FleetSnapshot | None, uncached_tokens: int,
                            ttft_s: float) -> None:
        """A stream's first token came from ``backend`` after ``ttft_s``: the predictor learns
        from it, and the stream's end will be recorded there."""
        if snapshot is not None:
            features = snapshot_features(snapshot, backend, uncached_tokens)
            self.predictor.observe(backend, features, ttft_s)
        if self.is_enabled and admitted is not None:
            admitted.backend = backend

    def finished(self, admitted: Admitted | None, actual_tokens: int) -> None:
        """Settle the queue's charge for an admitted request to its actual tokens (one that
        was refused or expired, ``admitted`` None, was charged nothing and gets nothing back)
        and let the dispatcher look again. Called for every request ``admit`` saw."""
        now_s = time.monotonic()
        if admitted is not None and admitted.backend is not None:
            self.finishes.record(admitted.backend, now_s)
        self.ends.arrived(_ENDS, now_s)
        if admitted is not None and admitted.tier is not None:
            self.num_running_by_tier[admitted.tier] -= 1
            self.queue.charge(admitted.tenant, actual_tokens - admitted.charged_tokens,
                              admitted.tier)
            admitted.tier = None  # settled once
        if self.is_enabled and len(self.queue):
            self._wakeup.set()

    def stream_ending(self) -> None:
        """A stream is on its last step (``Router.nearly_done``): its slot may take a queued
        request now. Called from the upstream connection's data callback; never raises."""
        if self.is_enabled and len(self.queue):
            self._wakeup.set()

    # -- the dispatcher -------------------------------------------------------------------
    async def run_dispatcher(self) -> None:
        while True:
            if len(self.queue):  # look again every tick: deadlines pass, the fleet frees up
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._tick_s):
                        await self._wakeup.wait()
            else:  # nothing queued: sleep until a request is (no idle ticks, no CPU)
                await self._wakeup.wait()
            self._wakeup.clear()
            self.dispatch(time.monotonic())
            await asyncio.sleep(0)

    def dispatch(self, now_s: float) -> int:
        """Release queued requests while the fleet has room; answer the expired. One pass."""
        for entry in self.queue.expire(now_s):
            waiter = self._waiters.get(entry.entry_id)
            if waiter is not None and not waiter.done():
                tier = self.tiers[entry.tier]
                decision = reject_expired(tier, entry.arrival_s, now_s,
                                          num_queued_ahead=self.queue.num_ahead(tier),
                                          slot_free_rate_per_s=self.ends.rate(_ENDS, now_s))
                waiter.set_exception(_Expired(decision.reason, decision.retry_after_s))
        # One release per pass: the released handler routes (and counts itself in flight on
        # its backend) before the next pass looks at the fleet again.
        while len(self.queue):
            snapshot = self._snapshot(now_s)
            if not fleet_has_capacity(snapshot):
                return 0
            owed = self.owed_tier(snapshot)
            popped = None
            if owed is not None and self._may_take_owed_slot(snapshot, now_s):
                popped = self.queue.pop(now_s, tier=owed[0].name)
            if popped is None:
                popped = self.queue.pop(now_s, self._max_dispatch_priority(snapshot, now_s))
            if popped is None:
                return 0
            waiter = self._waiters.get(popped.entry_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
                self._wakeup.set()
                return 1
        return 0

    # -- headroom for higher tiers (admission/headroom.py) ---------------------------------
    def reserved_slots(self, tier: Tier, snapshot: FleetSnapshot, now_s: float,
                       model: str | None = None, room: tuple[int, int] | None = None) -> int:
        """Free batch slots a request of ``tier`` must leave to the tiers above it (``room``:
        the snapshot's ``fleet_free_slots``, when the caller has it)."""
        if self.headroom_factor <= 0 or not any(
                self.arrivals.rate(t.name, now_s) for t in self.tiers.values()
                if t.priority < tier.priority):
            return 0  # the top tier, or nothing above it lately: nothing to keep
        room = room or fleet_free_slots(snapshot, model=model)
        if room is None:
            return 0  # a backend without max_batch: the fleet's room is unknown
        return reserved_slots(tier, self.tiers.values(), self.arrivals, now_s,
                              total_slots=room[1], factor=self.headroom_factor,
                              max_share=self.headroom_max_share)

    # -- the floor for backlogged lower tiers ----------------------------------------------
    def floor_slots(self, snapshot: FleetSnapshot) -> int:
        """Batch slots a backlogged lower tier may always hold: ``lower_tier_share`` of the
        fleet's slots, at least one (one when the fleet's slots are unknown)."""
        room = fleet_free_slots(snapshot)
        total = room[1] if room is not None else 0
        return max(1, int(self.lower_tier_share * total)) if self.lower_tier_share > 0 else 0

    def owed_tier(self, snapshot: FleetSnapshot) -> tuple[Tier, int] | None:
        """The highest lower tier (not the top one) with requests queued and fewer running
        than its floor, and how many slots it is short: the dispatcher gives it the next free
        slot, ahead of the tiers above it but the top one, and direct admissions of those
        tiers leave it those slots. The queue's token share alone left batch without a first
        token for 39 s at 2x: the higher tiers' requests mostly start without queueing,
        earning it no credit."""
        if not len(self.queue):
            return None
        lengths = self.queue.lengths()
        floor: int | None = None
        for tier in self._ranked[1:]:
            if not lengths.get(tier.name):
                continue
            if floor is None:
                floor = self.floor_slots(snapshot)
            short = floor - self.num_running_by_tier.get(tier.name, 0)
            if short > 0:
                return tier, short
        return None

    def owed_slots_below(self, tier: Tier, snapshot: FleetSnapshot) -> int:
        """Free slots a request of ``tier`` must leave to an owed lower tier (the top tier
        leaves none)."""
        if not len(self.queue) or tier.priority == self._ranked[0].priority:
            return 0
        owed = self.owed_tier(snapshot)
        if owed is None or owed[0].priority <= tier.priority:
            return 0
        return owed[1]

    def _may_take_owed_slot(self, snapshot: FleetSnapshot, now_s: float) -> bool:
        """An owed tier's request keeps only the top tier's headroom free (what a request
        of the second tier must leave), and never goes ahead of a queued top-tier request
        (with the headroom off, nothing else would hold it back)."""
        if self.queue.num_ahead(self._ranked[0]):
            return False
        room = fleet_free_slots(snapshot)
        if room is None:
            return True
        return room[0] > self.reserved_slots(self._ranked[1], snapshot, now_s, room=room)

    def _max_dispatch_priority(self, snapshot: FleetSnapshot, now_s: float) -> int | None:
        """The lowest tier (largest priority number) the fleet's free slots may go to now."""
        if self.headroom_factor <= 0:
            return None
        room = fleet_free_slots(snapshot)
        if room is None:
            return None
        free, _ = room
        allowed: int | None = None
        for tier in sorted(self.tiers.values(), key=lambda t: t.priority):
            if (self.reserved_slots(tier, snapshot, now_s, room=room) >= free
                    and allowed is not None):
                break
            allowed = tier.priority
        return allowed


class _Expired(Exception):
    """Handed to a queued request's waiter when its deadline passed in the queue."""

    def __init__(self, reason: str, retry_after_s: float | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s
