"""Start-time fair queuing of tenants within one tier (Goyal, Vin and Cheng, SIGCOMM '96).

Each tenant's requests wait in a FIFO (a *flow*). Service is measured in tokens and charged
against a virtual clock:

- when a flow becomes backlogged, its head gets the start tag ``S = max(v, F)``: ``F`` is the
  flow's finish tag, ``v`` the tier's virtual time. Taking the ``max`` means an idle tenant
  banks no credit: it rejoins at the current virtual time, not where it left off;
- dispatch takes the flow with the smallest start tag, sets ``v = S`` and
  ``F = S + cost_tokens / weight``; the flow's next head starts at ``F``;
- ``charge`` settles actual usage later: ``F += tokens / weight`` (negative refunds);
- ``charge_unqueued`` charges a request admitted without waiting (the tier's queue was empty)
  as a dispatch would, ``F = max(v, F) + cost / weight``, but leaves the tenant at most
  ``max_debt_requests`` such requests' cost ahead of ``v``: service taken while nobody waited
  counts against the tenant in the next busy period, a bounded amount (one that had the fleet
  to itself for an hour is not starved for an hour once others arrive). Without it, the
  moments a tier's queue ran empty at 2x overload went to whoever arrived then, uncharged,
  which is mostly the heaviest tenant;
- when the tier empties, ``v`` jumps to the largest finish tag (the end of a busy period).

Guarantee (SFQ theorem 1): over any interval in which tenants i and j are both backlogged, the
tokens charged to them satisfy ``|W_i / w_i - W_j / w_j| <= c_i / w_i + c_j / w_j``, where
``c`` is the tenant's largest single charge: equal weights get equal service to within two
requests, whatever their arrival rates.

Push, dispatch and charge are O(log n); removal is O(1) amortised (lazy deletion).

Example::

    tier = TierFairQueue()
    tier.add(Slot(QueueEntry("r1", tenant="a", tier="standard", cost_tokens=500,
                             arrival_s=0.0)))
    tier.take_head().entry.entry_id     # "r1"
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from admission.lazy_heap import LazyHeap

_MIN_FLOW_COMPACT = 16


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One waiting request, as the queue sees it (the gateway keeps the rest by ``entry_id``).

    ``cost_tokens`` is the estimate charged at dispatch (prompt plus expected output);
    settle the difference with ``FairQueue.charge``. ``deadline_s`` None means no deadline.
    """

    entry_id: str
    tenant: str
    tier: str
    cost_tokens: int
    arrival_s: float
    deadline_s: float | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.cost_tokens < 0:
            raise ValueError(f"cost_tokens must be >= 0, got {self.cost_tokens}")
        if not self.weight > 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")


def charged_tokens(entry: QueueEntry) -> int:
    """Tokens an entry counts for when dispatched: at least 1, so nothing is free."""
    return charge_of(entry.cost_tokens)


def charge_of(cost_tokens: int) -> int:
    """What a request estimated at ``cost_tokens`` is charged when it starts: at least 1."""
    return max(1, cost_tokens)


class Slot:
    """An entry's place in the queue; ``is_live`` turns False when it leaves. ``is_front``:
    it waits in the tier's front lane (a returning request: ``TierFairQueue.add``)."""

    __slots__ = ("arrival_handle", "deadline_handle", "entry", "is_front", "is_live")

    def __init__(self, entry: QueueEntry, *, is_front: bool = False) -> None:
        self.entry = entry
        self.is_live = True
        self.is_front = is_front
        self.arrival_handle = -1
        self.deadline_handle = -1


class _Flow:
    __slots__ = ("finish_tag", "handle", "num_live", "slots", "weight")

    def __init__(self, finish_tag: float) -> None:
        self.slots: deque[Slot] = deque()
        self.num_live = 0
        self.finish_tag = finish_tag
        self.weight = 1.0
        self.handle: int | None = None  # its item in the flow heap while backlogged

    def front(self) -> Slot:
        while not self.slots[0].is_live:
            self.slots.popleft()
        return self.slots[0]


class TierFairQueue:
    """The tenants of one tier, served in start-tag order, after the front lane.

    The front lane holds requests that come back when their ``Retry-After`` said
    (``admission.retry_book``): they keep the place their refusal promised, so they leave
    first, in the order they came back, and are charged to their tenant's flow like any
    dispatch (the tenant's next requests wait that much longer in the fair order)."""

    def __init__(self) -> None:
        self.virtual_time = 0.0
        self.num_live = 0
        self._front: deque[Slot] = deque()
        self._max_finish_tag = 0.0
        self._flows: dict[str, _Flow] = {}
        self._flow_heap: LazyHeap[str] = LazyHeap()  # backlogged tenants by head start tag
        self._arrivals: LazyHeap[Slot] = LazyHeap()  # live slots by arrival time

    def add(self, slot: Slot) -> None:
        entry = slot.entry
        if slot.is_front:
            self._front.append(slot)
            self.num_live += 1
            slot.arrival_handle = self._arrivals.push(entry.arrival_s, slot)
            return
        flow = self._flows.get(entry.tenant)
        if flow is None:
            flow = self._flows[entry.tenant] = _Flow(self.virtual_time)
        flow.slots.append(slot)
        flow.num_live += 1
        flow.weight = entry.weight
        self.num_live += 1
        slot.arrival_handle = self._arrivals.push(entry.arrival_s, slot)
        if flow.handle is None:
            self._schedule(entry.tenant, flow)

    def head(self) -> Slot:
        """The slot dispatch would take next; the tier must not be empty."""
        front = self._live_front()
        if front is not None:
            return front
        top = self._flow_heap.peek()
        assert top is not None, "head() of an empty tier"
        return self._flows[top[1]].front()

    def oldest_arrival_s(self) -> float:
        top = self._arrivals.peek()
        return float("inf") if top is None else top[0]

    def take_head(self) -> Slot:
        """Dispatch: remove the head slot and charge its tenant ``charged_tokens``."""
        front = self._live_front()
        if front is not None:
            self._front.popleft()
            self.charge(front.entry.tenant, charged_tokens(front.entry), front.entry.weight)
            self._leave_front(front)
            return front
        top = self._flow_heap.pop()
        assert top is not None, "take_head() of an empty tier"
        start_tag, tenant = top
        flow = self._flows[tenant]
        flow.handle = None
        slot = flow.front()
        self.virtual_time = start_tag
        flow.finish_tag = start_tag + charged_tokens(slot.entry) / slot.entry.weight
        self._max_finish_tag = max(self._max_finish_tag, flow.finish_tag)
        self._leave(tenant, flow, slot)
        return slot

    def drop(self, slot: Slot) -> None:
        """Remove a slot that was not served (expired, or the client went away)."""
        if slot.is_front:
            self._leave_front(slot)
            return
        flow = self._flows[slot.entry.tenant]
        self._leave(slot.entry.tenant, flow, slot)
        if flow.num_live and len(flow.slots) > 2 * flow.num_live + _MIN_FLOW_COMPACT:
            flow.slots = deque(s for s in flow.slots if s.is_live)

    def charge(self, tenant: str, tokens: int, weight: float | None = None) -> None:
        """Settle ``tokens`` more (or, negative, fewer) than the tenant was charged."""
        flow = self._flow(tenant)
        if weight is not None:
            flow.weight = weight
        base = max(flow.finish_tag, self.virtual_time) if tokens > 0 else flow.finish_tag
        self._retag(tenant, flow, base + tokens / flow.weight)

    def charge_unqueued(self, tenant: str, tokens: int, weight: float,
                        max_debt_requests: float) -> None:
        """Charge ``tokens`` (at least 1) for a request admitted without queueing, the
        tenant's finish tag capped at ``max_debt_requests`` times its cost past the virtual
        time (never lowered by the cap); settle it later with ``charge`` like a dispatch."""
        flow = self._flow(tenant)
        flow.weight = weight
        cost = charge_of(tokens) / weight
        charged = max(flow.finish_tag, self.virtual_time) + cost
        cap = self.virtual_time + max_debt_requests * cost
        self._retag(tenant, flow, max(flow.finish_tag, min(charged, cap)))

    def _flow(self, tenant: str) -> _Flow:
        flow = self._flows.get(tenant)
        if flow is None:
            flow = self._flows[tenant] = _Flow(self.virtual_time)
        return flow

    def _retag(self, tenant: str, flow: _Flow, finish_tag: float) -> None:
        """Move a tenant's finish tag: rescheduled while backlogged, forgotten once idle at
        or below the virtual time (it keeps neither credit nor debt)."""
        flow.finish_tag = finish_tag
        self._max_finish_tag = max(self._max_finish_tag, finish_tag)
        if flow.handle is not None:
            self._flow_heap.discard(flow.handle)
            self._schedule(tenant, flow)
        elif finish_tag <= self.virtual_time:
            del self._flows[tenant]

    def _live_front(self) -> Slot | None:
        while self._front and not self._front[0].is_live:
            self._front.popleft()
        return self._front[0] if self._front else None

    def _leave_front(self, slot: Slot) -> None:
        slot.is_live = False
        self.num_live -= 1
        self._arrivals.discard(slot.arrival_handle)
        if self.num_live == 0:
            self._front.clear()
            self.virtual_time = max(self.virtual_time, self._max_finish_tag)
            self._flows.clear()

    def _schedule(self, tenant: str, flow: _Flow) -> None:
        flow.handle = self._flow_heap.push(max(self.virtual_time, flow.finish_tag), tenant)

    def _leave(self, tenant: str, flow: _Flow, slot: Slot) -> None:
        slot.is_live = False
        flow.num_live -= 1
        self.num_live -= 1
        self._arrivals.discard(slot.arrival_handle)
        if flow.num_live:
            if flow.handle is None:  # dispatched its head: the next head starts at F
                self._schedule(tenant, flow)
            return
        if flow.handle is not None:
            self._flow_heap.discard(flow.handle)
            flow.handle = None
        flow.slots.clear()
        if self.num_live == 0:  # end of a busy period: nobody keeps credit or debt
            self.virtual_time = max(self.virtual_time, self._max_finish_tag)
            self._flows.clear()
        elif flow.finish_tag <= self.virtual_time:
            del self._flows[tenant]
