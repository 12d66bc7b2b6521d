"""SLO-class admission in the gateway: admit, queue fairly, or reject early.

The decision is ``admission.policy.decide`` (pure) on the same fleet snapshot routing uses.
Queued requests wait here, in ``admission.FairQueue`` (strict priority across tiers with a
guaranteed share for lower ones, token-weighted fairness across tenants within a tier), and a
dispatcher releases them while the fleet has capacity, so overload waits in the gateway, where
it can be ordered, instead of in the workers' FIFO queues. A request whose deadline passes in
the queue is answered 503 before any upstream work; a client that leaves is dropped from the
queue. The TTFT predictor learns from every streamed first token.

The snapshot admission decides on is corrected for the streams this gateway saw end after a
worker's last heartbeat was made (``admission.finishes``): without that, a slot held free for
interactive traffic looked busy for up to a heartbeat interval after each registry poll.

Example::

    slo = SloAdmission(settings.tiers, router)
    tier = slo.tier_for(principal, request.headers.get("x-switchyard-tier"))
    await slo.admit(tier, principal, plan, request_id)     # returns, or raises APIError 503
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Iterator

from admission.fair_queue import FairQueue, FairQueueConfig, QueueEntry
from admission.finishes import RecentFinishes
from admission.headroom import ArrivalRates, reserved_slots
from admission.policy import (
    AdmissionRequest,
    decide,
    fleet_free_slots,
    fleet_has_capacity,
    reject_expired,
)
from admission.predictor import TtftPredictor, snapshot_features
from admission.retry_book import RetryBook, retry_key
from admission.sfq import charge_of
from admission.tiers import (
    Tier,
    TierConfig,
    TierConfigError,
    TierNotAllowedError,
    UnknownTierError,
    resolve_tier,
    tier_table,
)
from gateway.auth import Principal
from gateway.errors import APIError
from gateway.observe.metrics import counter_family, gauge_family
from gateway.router import RoutePlan, Router
from routing.types import FleetSnapshot

log = logging.getLogger(__name__)
TIER_HEADER = "x-switchyard-tier"
_ENDS = "all"  # the one key of SloAdmission.ends


class SloAdmission:
    def __init__(self, tiers: Iterable[Tier | TierConfig], router: Router, *,
                 is_enabled: bool = True, tick_s: float = 0.01,
                 queue_config: FairQueueConfig | None = None, headroom_factor: float = 0.5,
                 headroom_max_share: float = 0.25) -> None:
        self.tiers = tier_table(tiers)
        self._ranked = sorted(self.tiers.values(), key=lambda t: t.priority)  # top tier first
        self.arrivals = ArrivalRates()
        self.headroom_factor = headroom_factor
        self.headroom_max_share = headroom_max_share
        self.router = router
        self.is_enabled = is_enabled
        self.queue = FairQueue(self.tiers.values(), queue_config)
        self.predictor = TtftPredictor()
        self.finishes = RecentFinishes()
        self.ends = ArrivalRates(tau_s=5.0)  # requests ending: how fast slots free (Retry-After)
        self.starts = ArrivalRates(tau_s=5.0)  # requests admitted, per tier (retry booking)
        # The backend each streaming request got its first token from, by the handler's task
        # (``observe_first_token`` and ``finished`` run in it): to record where a stream ended.
        self._stream_backends: dict[asyncio.Task[object], str] = {}
        self._waiters: dict[str, asyncio.Future[None]] = {}
        # Requests admitted and not yet finished, per tier, and each one's tier and the tokens
        # its tenant was charged for it, by the handler's task (``admit`` and ``finished`` run
        # in it): the floor of batch slots a backlogged lower tier is owed (``owed_tier``),
        # and the charge ``finished`` settles (a refused request was charged nothing).
        self.num_running_by_tier: dict[str, int] = dict.fromkeys(self.tiers, 0)
        self._running_tiers: dict[asyncio.Task[object], tuple[str, int]] = {}
        self.lower_tier_share = (queue_config or FairQueueConfig()).lower_tier_share
        self.retries = RetryBook()  # refusals' booked returns (admission/retry_book.py)
        self._wakeup = asyncio.Event()
        self._tick_s = tick_s
        self.num_rejected: dict[str, int] = {}
        self.num_queued = 0

    # -- per request ----------------------------------------------------------------------
    def tier_for(self, principal: Principal, requested: str | None) -> Tier:
        try:
            return resolve_tier(self.tiers, principal.tenant.tier, principal.key.tier, requested)
        except UnknownTierError as exc:
            raise APIError.bad_request(str(exc), param=TIER_HEADER, code="unknown_tier") from None
        except TierNotAllowedError as exc:
            raise APIError.forbidden(str(exc), code="tier_not_allowed",
                                     param=TIER_HEADER) from None
        except TierConfigError as exc:
            raise APIError(500, f"Gateway misconfiguration: {exc}", type="server_error",
                           code="tier_misconfigured") from None

    async def admit(self, tier: Tier, principal: Principal, plan: RoutePlan,
                    request_id: str, body: bytes | None = None) -> None:
        """Return when the request may go upstream; raise APIError 503 when it may not.

        ``body``: the request's bytes, which with the tenant identify it when it comes back
        after a refusal's ``Retry-After`` (``admission.retry_book``): a request back in time
        goes to the front of its tier's queue."""
        if not self.is_enabled:
            return
        plan.needs_free_slot = True
        now_s = time.monotonic()
        # The body is hashed only when some ticket is out or the request is refused.
        key = (retry_key(principal.tenant.id, body)
               if body is not None and len(self.retries) else None)
        is_returning = key is not None and self.retries.redeem(key, now_s) is not None
        snapshot = self._snapshot(now_s, plan)
        if not any(b.is_healthy for b in snapshot.backends):
            return  # nothing to wait for: routing answers 503 no_healthy_backend at once
        request = AdmissionRequest(tier=tier, tenant=principal.tenant.id,
                                   prompt_tokens=plan.request.num_prompt_tokens,
                                   model=plan.request.model, arrival_s=now_s,
                                   max_tokens=plan.request.max_tokens)
        self.arrivals.arrived(tier.name, now_s)
        decision = decide(request, snapshot, self.predictor, now_s,
                          num_queued_ahead=self.queue.num_ahead(tier) if len(self.queue) else 0,
                          reserved_slots=self.reserved_slots(tier, snapshot, now_s,
                                                             plan.request.model)
                          + self.owed_slots_below(tier, snapshot),
                          slot_free_rate_per_s=self.ends.rate(_ENDS, now_s))
        if decision.action == "admit":
            plan.snapshot = snapshot  # routing reuses it: no second snapshot
            plan.snapshot_taken_s = now_s
            # Charged to the tenant's fair order as a dispatch is (bounded): the moments the
            # tier's queue runs empty under overload otherwise go free to whoever sends most.
            self._started(tier, self.queue.charge_direct(
                principal.tenant.id, plan.reserved_tokens, tier.name, principal.tenant.weight))
            return
        deadline_s = decision.deadline_s
        if is_returning:
            # Back when its refusal said: it waits at the front of its tier, for its tier's
            # usual wait (a tier that never queues: its TTFT SLO), whatever the prediction.
            deadline_s = now_s + max(tier.max_wait_s, tier.ttft_slo_s)
        elif decision.action == "reject":
            self._reject_count(decision.reason)
            raise self._refused(tier, decision.reason, decision.retry_after_s,
                                principal, body, now_s)
        entry = QueueEntry(entry_id=request_id, tenant=principal.tenant.id, tier=tier.name,
                           cost_tokens=plan.reserved_tokens, arrival_s=now_s,
                           deadline_s=deadline_s, weight=principal.tenant.weight)
        if request_id in self.queue or not self.queue.push(entry, now_s,
                                                           is_front=is_returning):
            self._reject_count("queue full")
            raise self._refused(tier, "the admission queue is full", 1.0, principal, body, now_s)
        self.num_queued += 1
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = waiter
        self._wakeup.set()
        try:
            await waiter
        except _Expired as expired:
            raise self._refused(tier, expired.reason, expired.retry_after_s, principal, body,
                                time.monotonic()) from None
        finally:
            self._waiters.pop(request_id, None)
            self.queue.remove(request_id)  # no-op once dispatched; the client may have left
        # Routing runs before the handler's next await and reuses this (the corrected figures).
        now_s = time.monotonic()
        plan.snapshot = self._snapshot(now_s, plan)
        plan.snapshot_taken_s = now_s
        self._started(tier, charge_of(plan.reserved_tokens))  # what the dispatch charged

    def _refused(self, tier: Tier, reason: str, retry_after_s: float | None,
                 principal: Principal, body: bytes | None, now_s: float) -> APIError:
        """The 503 for a refusal, its return booked when the request can be known again."""
        if body is not None:
            key = retry_key(principal.tenant.id, body)
            # Returns are booked against how fast this tier's requests start lately (they
            # leave the front of its queue no faster); the fleet's ends before any started.
            rate = self.starts.rate(tier.name, now_s) or self.ends.rate(_ENDS, now_s)
            retry_after_s = self.retries.issue(key, tier.name, now_s, retry_after_s or 1.0,
                                               rate_per_s=rate)
        return _overloaded(tier, reason, retry_after_s)

    def _started(self, tier: Tier, charged_tokens: int) -> None:
        self.starts.arrived(tier.name, time.monotonic())
        task = _current_task()
        if task is not None:
            self._running_tiers[task] = (tier.name, charged_tokens)
            self.num_running_by_tier[tier.name] += 1

    def _snapshot(self, now_s: float, plan: RoutePlan | None = None) -> FleetSnapshot:
        """The fleet as routing sees it, less the streams seen ending after each heartbeat."""
        snapshot = (self.router.fleet_snapshot(now_s) if plan is None
                    else self.router.snapshot(plan.request, now_s))
        return self.finishes.correct(snapshot, self._reported_running)

    def _reported_running(self, name: str) -> int | None:
        backend = self.router.registry.get(name)
        return None if backend is None else backend.num_running_reported

    def observe_first_token(self, backend: str, snapshot: FleetSnapshot | None,
                            uncached_tokens: int, ttft_s: float) -> None:
        if snapshot is not None:
            features = snapshot_features(snapshot, backend, uncached_tokens)
            self.predictor.observe(backend, features, ttft_s)
        task = _current_task()
        if self.is_enabled and task is not None:
            self._stream_backends[task] = backend

    def finished(self, tenant: str, actual_tokens: int) -> None:
        """Settle the queue's charge for an admitted request to its actual tokens (one that
        was refused or expired was charged nothing, and gets nothing back) and let the
        dispatcher look again. Called for every request ``admit`` saw, admitted or not."""
        task = _current_task()
        backend = self._stream_backends.pop(task, None) if task is not None else None
        running = self._running_tiers.pop(task, None) if task is not None else None
        now_s = time.monotonic()
        if backend is not None:
            self.finishes.record(backend, now_s)
        self.ends.arrived(_ENDS, now_s)
        if running is not None:
            running_tier, charged_tokens = running
            self.num_running_by_tier[running_tier] -= 1
            self.queue.charge(tenant, actual_tokens - charged_tokens, running_tier)
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
                self._reject_count("deadline passed in the queue")
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

    def _reject_count(self, reason: str) -> None:
        key = _reason_label(reason)
        self.num_rejected[key] = self.num_rejected.get(key, 0) + 1

    def collect_metrics(self) -> Iterator[object]:
        """Queue lengths, rejections by reason, the predictor's error: read at scrape time."""
        yield gauge_family("switchyard_admission_queue_length",
                           "Requests waiting in the gateway's admission queue.", "tier",
                           {name: float(n) for name, n in self.queue.lengths().items()})
        yield counter_family("switchyard_admission_rejections",
                             "Requests refused by SLO admission, by reason.", "reason",
                             {k: float(v) for k, v in self.num_rejected.items()})
        yield counter_family("switchyard_admission_queued",
                             "Requests that waited in the admission queue.", None,
                             float(self.num_queued))
        yield counter_family("switchyard_admission_retry_tickets_issued",
                             "Refusals whose return was booked (admission/retry_book.py).",
                             None, float(self.retries.num_issued))
        yield counter_family("switchyard_admission_retry_tickets_redeemed",
                             "Refused requests that came back in their booked window and "
                             "waited at the front of their tier's queue.", None,
                             float(self.retries.num_redeemed))
        errors = self.predictor.error_stats()
        yield gauge_family("switchyard_ttft_predictor_mape",
                           "Mean absolute percentage error of recent TTFT predictions.", None,
                           errors.mape)
        yield gauge_family("switchyard_ttft_predictor_bias_seconds",
                           "Mean predicted minus observed TTFT over recent predictions.", None,
                           errors.bias_s)


class _Expired(Exception):
    """Handed to a queued request's waiter when its deadline passed in the queue."""

    def __init__(self, reason: str, retry_after_s: float | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


def _current_task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop (a synchronous caller)
        return None


def _reason_label(reason: str) -> str:
    """A bounded label for a free-text reason."""
    for needle, label in (("queue is full", "queue_full"), ("deadline", "deadline"),
                          ("saturated", "saturated"), ("exceeds", "slo_miss"),
                          ("no healthy", "no_backend")):
        if needle in reason:
            return label
    return "other"


def _overloaded(tier: Tier, reason: str, retry_after_s: float | None) -> APIError:
    retry_s = max(1, round(retry_after_s or 1))
    return APIError(
        503,
        f"The fleet cannot serve this {tier.name!r}-tier request within its SLO right now "
        f"({reason}); retry after {retry_s} s or use a lower tier.",
        type="service_unavailable", code="overloaded",
        headers={"Retry-After": str(retry_s), "retry-after-ms": str(retry_s * 1000)},
    )
