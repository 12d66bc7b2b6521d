"""The gateway's admission queue: strict tier priority with a guaranteed share, fair tenants.

Overload waits here, in the gateway, rather than in the workers' FIFO queues: the dispatcher
pops while ``admission.policy.fleet_has_capacity(snapshot)`` holds. A pure data structure:
no clock (``now_s`` is passed in), no I/O, deterministic (ties go to the earlier push).

Across tiers: strict priority (priority 0 first), except that lower tiers are guaranteed a
share of the dispatched tokens, so they never starve. With ``lower_tier_share = s`` and
``r = s / (1 - s)``, every token dispatched from the highest backlogged tier while a lower
tier waits earns the lower tiers ``r`` tokens of credit; when the credit covers the cost of
the next lower-tier request it is dispatched and its cost spent. The lower tier served is the
one whose oldest request has waited longest; within it, its fair order decides. Credit is
not banked: it resets whenever no lower tier waits. Bound: over any interval in which a lower
tier stays backlogged, ``lower_tokens >= r * top_tokens - max_lower_cost`` (and never more
than ``r * top_tokens`` while the top tier is backlogged). ``s = 0`` is strict priority.

Within a tier: start-time fair queuing across tenants by tokens (``admission.sfq``): equal
weights get equal service to within two requests' cost, whatever their arrival rates, and an
idle tenant banks no credit.

Bounds: ``push`` refuses (returns False) past ``max_total``, the tier's limit or
``max_per_tenant``; ``expire`` hands back every entry whose deadline passed, to be answered
with a 503 before any upstream work (``pop`` never returns one; it sets them aside for the
next ``expire``). All operations are O(log n) (times the number of tiers, a handful).

Example::

    queue = FairQueue(DEFAULT_TIERS, FairQueueConfig(lower_tier_share=0.1))
    queue.push(QueueEntry("r1", "acme", "batch", cost_tokens=900, arrival_s=now_s,
                          deadline_s=now_s + 600), now_s)               # True
    while fleet_has_capacity(snapshot) and (entry := queue.pop(now_s)) is not None:
        dispatch(entry)
    for entry in queue.expire(now_s):
        reject(entry)   # 503 with Retry-After
    queue.charge("acme", actual_tokens - 900, tier="batch")   # settle when it finishes
    charged = queue.charge_direct("acme", 900, "batch")      # admitted without queueing
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from admission.lazy_heap import LazyHeap
from admission.sfq import QueueEntry, Slot, TierFairQueue, charge_of, charged_tokens
from admission.tiers import Tier

__all__ = ["FairQueue", "FairQueueConfig", "QueueEntry"]


@dataclass(frozen=True, slots=True)
class FairQueueConfig:
    """Queue bounds and the lower tiers' guaranteed share of dispatched tokens."""

    lower_tier_share: float = 0.05
    max_total: int = 10_000
    max_per_tier: int = 4_096
    tier_limits: Mapping[str, int] = field(default_factory=dict)  # per-tier overrides
    max_per_tenant: int | None = None
    # A request admitted without queueing is charged to its tenant's fair order, leaving the
    # tenant at most this many such requests' cost of debt (``admission.sfq``).
    max_direct_debt_requests: float = 2.0

    def __post_init__(self) -> None:
        if not 0 <= self.lower_tier_share < 1:
            raise ValueError(f"lower_tier_share must be in [0, 1), got {self.lower_tier_share}")
        if not self.max_direct_debt_requests >= 0:
            raise ValueError("max_direct_debt_requests must be >= 0, got "
                             f"{self.max_direct_debt_requests}")
        limits = [self.max_total, self.max_per_tier, *self.tier_limits.values()]
        if self.max_per_tenant is not None:
            limits.append(self.max_per_tenant)
        if min(limits) < 0:
            raise ValueError("queue limits must be >= 0")


class _Level:
    __slots__ = ("fair", "max_len", "tier")

    def __init__(self, tier: Tier, max_len: int) -> None:
        self.tier = tier
        self.max_len = max_len
        self.fair = TierFairQueue()


class FairQueue:
    """Waiting requests of every tier; see the module docstring for the order they leave in."""

    def __init__(self, tiers: Iterable[Tier], config: FairQueueConfig | None = None) -> None:
        self.config = config or FairQueueConfig()
        ordered = sorted(tiers, key=lambda t: (t.priority, t.name))
        self._levels = {t.name: _Level(t, self.config.tier_limits.get(t.name,
                                                                      self.config.max_per_tier))
                        for t in ordered}
        if len(self._levels) != len(ordered):
            raise ValueError("tier names must be unique")
        unknown = set(self.config.tier_limits) - set(self._levels)
        if unknown:
            raise ValueError(f"tier_limits name unknown tiers: {sorted(unknown)}")
        share = self.config.lower_tier_share
        self._share_ratio = share / (1 - share)
        self._credit_tokens = 0.0
        self._slots: dict[str, Slot] = {}
        self._per_tenant: dict[str, int] = {}
        self._deadlines: LazyHeap[Slot] = LazyHeap()
        self._expired: list[QueueEntry] = []

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._slots

    def lengths(self) -> dict[str, int]:
        """Waiting entries per tier name, highest priority first (for metrics)."""
        return {name: level.fair.num_live for name, level in self._levels.items()}

    def num_ahead(self, tier: Tier) -> int:
        """Entries waiting in tiers of ``tier``'s priority or higher: they go before it."""
        return sum(level.fair.num_live for level in self._levels.values()
                   if level.tier.priority <= tier.priority)

    def push(self, entry: QueueEntry, now_s: float, *, is_front: bool = False) -> bool:
        """Enqueue ``entry``; False (and nothing stored) when a size bound is reached.

        ``now_s`` is when it is queued; its ``arrival_s`` (which orders the tier share) may be
        earlier. An entry whose deadline has already passed is handed back by ``expire``.
        ``is_front``: it goes ahead of its tier's fair order, behind the tier's other front
        entries (a request back when its ``Retry-After`` said: ``admission.retry_book``).
        """
        level = self._level(entry.tier)
        if entry.entry_id in self._slots:
            raise ValueError(f"entry {entry.entry_id!r} is already queued")
        num_tenant = self._per_tenant.get(entry.tenant, 0)
        max_per_tenant = self.config.max_per_tenant
        if (len(self._slots) >= self.config.max_total or level.fair.num_live >= level.max_len
                or (max_per_tenant is not None and num_tenant >= max_per_tenant)):
            return False
        slot = Slot(entry, is_front=is_front)
        self._slots[entry.entry_id] = slot
        self._per_tenant[entry.tenant] = num_tenant + 1
        if entry.deadline_s is not None:
            slot.deadline_handle = self._deadlines.push(entry.deadline_s, slot)
        level.fair.add(slot)
        return True

    def pop(self, now_s: float, max_priority: int | None = None,
            tier: str | None = None) -> QueueEntry | None:
        """The next entry to dispatch, charged to its tenant; None when nothing is waiting.

        ``max_priority`` leaves tiers of a larger priority number waiting (the fleet's last
        free slots are held for higher tiers: ``admission.headroom``); their share credit
        still accrues. ``tier`` takes the next entry of that tier alone, in its fair order
        (the floor of batch slots for a backlogged lower tier: ``admission.waiting_room``);
        it spends the tier's share credit like any lower-tier dispatch."""
        self._expired.extend(self._take_expired(now_s))
        waiting = [level for level in self._levels.values() if level.fair.num_live]
        if not waiting:
            self._credit_tokens = 0.0
            return None
        if tier is not None:
            eligible = [level for level in waiting if level.tier.name == tier]
        else:
            eligible = waiting if max_priority is None else [
                level for level in waiting if level.tier.priority <= max_priority]
        if not eligible:
            return None
        chosen = eligible[0]
        if len(waiting) == 1:
            self._credit_tokens = 0.0
        elif tier is None and len(eligible) > 1:
            lower = min(eligible[1:], key=lambda level: level.fair.oldest_arrival_s())
            if self._credit_tokens >= charged_tokens(lower.fair.head().entry):
                chosen = lower
        slot = chosen.fair.take_head()
        self._forget(slot)
        cost = charged_tokens(slot.entry)
        if chosen is not waiting[0]:
            self._credit_tokens = max(0.0, self._credit_tokens - cost)
        elif len(waiting) > 1:
            self._credit_tokens += cost * self._share_ratio
        return slot.entry

    def expire(self, now_s: float) -> list[QueueEntry]:
        """Remove and return every entry whose deadline is at or before ``now_s``."""
        expired = self._expired + self._take_expired(now_s)
        self._expired = []
        return expired

    def remove(self, entry_id: str) -> QueueEntry | None:
        """Drop a waiting entry (its client went away); None if it is not waiting."""
        slot = self._slots.get(entry_id)
        if slot is None:
            return None
        self._levels[slot.entry.tier].fair.drop(slot)
        self._forget(slot)
        return slot.entry

    def charge(self, tenant: str, tokens: int, tier: str) -> None:
        """Settle actual usage in ``tier``: ``tokens`` beyond (negative: below) the estimate.

        Typically ``charge(e.tenant, actual_tokens - e.cost_tokens, e.tier)`` at completion.
        """
        self._level(tier).fair.charge(tenant, tokens)

    def charge_direct(self, tenant: str, tokens: int, tier: str, weight: float = 1.0) -> int:
        """Charge a request of ``tier`` admitted without waiting in the queue as if it had
        been dispatched (its debt bounded by ``max_direct_debt_requests``); settle it with
        ``charge(tenant, actual - returned, tier)`` when it finishes. Returns the tokens
        charged (``tokens``, at least 1)."""
        self._level(tier).fair.charge_unqueued(tenant, tokens, weight,
                                               self.config.max_direct_debt_requests)
        return charge_of(tokens)

    def _level(self, tier: str) -> _Level:
        level = self._levels.get(tier)
        if level is None:
            raise ValueError(f"unknown tier {tier!r}; queue tiers: {list(self._levels)}")
        return level

    def _take_expired(self, now_s: float) -> list[QueueEntry]:
        expired: list[QueueEntry] = []
        while (top := self._deadlines.peek()) is not None and top[0] <= now_s:
            slot = top[1]
            self._levels[slot.entry.tier].fair.drop(slot)
            self._forget(slot)
            expired.append(slot.entry)
        return expired

    def _forget(self, slot: Slot) -> None:
        entry = slot.entry
        del self._slots[entry.entry_id]
        self._deadlines.discard(slot.deadline_handle)
        remaining = self._per_tenant[entry.tenant] - 1
        if remaining:
            self._per_tenant[entry.tenant] = remaining
        else:
            del self._per_tenant[entry.tenant]
