"""The admission queue: fair tenants, strict tiers with a guaranteed share, bounds, expiry."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from admission.fair_queue import FairQueue, FairQueueConfig, QueueEntry
from admission.lazy_heap import LazyHeap
from admission.tiers import DEFAULT_TIERS, tier_table

TIERS = tier_table(DEFAULT_TIERS)
_ids = itertools.count()


def entry(tenant: str = "a", tier: str = "standard", cost: int = 100, arrival_s: float = 0.0,
          deadline_s: float | None = None, weight: float = 1.0,
          entry_id: str | None = None) -> QueueEntry:
    return QueueEntry(entry_id or f"e{next(_ids)}", tenant, tier, cost, arrival_s, deadline_s,
                      weight)


def queue(**config: object) -> FairQueue:
    return FairQueue(DEFAULT_TIERS, FairQueueConfig(**config))  # type: ignore[arg-type]


def drain(q: FairQueue, now_s: float = 0.0) -> list[QueueEntry]:
    out = []
    while (e := q.pop(now_s)) is not None:
        out.append(e)
    return out


def test_heavy_sender_gets_no_more_than_an_equal_share() -> None:
    """A sends 10x the requests of B; while both wait, tokens served differ by <= 2 requests."""
    rng = random.Random(5)
    q = queue(max_total=100_000, max_per_tier=100_000)
    served: Counter[str] = Counter()
    max_cost = 0
    for tick in range(400):
        for tenant, count in (("heavy", 10), ("light", 1)):
            for _ in range(count):
                cost = rng.randrange(100, 1000)
                max_cost = max(max_cost, cost)
                assert q.push(entry(tenant, cost=cost, arrival_s=tick), tick)
        e = q.pop(tick)
        assert e is not None
        served[e.tenant] += e.cost_tokens
        # SFQ bound for equal weights: |W_a - W_b| <= c_max_a + c_max_b
        assert abs(served["heavy"] - served["light"]) <= 2 * max_cost
    assert served["light"] > 0.45 * sum(served.values())


def test_weights_share_in_proportion() -> None:
    q = queue()
    for i in range(300):
        q.push(entry("gold", weight=2.0, arrival_s=i), 0.0)
        q.push(entry("plain", weight=1.0, arrival_s=i), 0.0)
    served = Counter(e.tenant for e in (q.pop(0.0) for _ in range(300)) if e is not None)
    assert served["gold"] == pytest.approx(2 * served["plain"], abs=2)


def test_idle_tenant_banks_no_credit() -> None:
    q = queue(max_per_tier=10_000, max_total=10_000)
    for _ in range(200):
        q.push(entry("busy"), 0.0)
    for _ in range(100):  # "idle" is idle meanwhile: 10,000 tokens of service to busy
        assert q.pop(0.0).tenant == "busy"  # type: ignore[union-attr]
    for _ in range(100):
        q.push(entry("idle"), 1.0)
    order = [q.pop(1.0).tenant for _ in range(20)]  # type: ignore[union-attr]
    # it rejoins at the current virtual time and alternates, instead of 100 in a row
    assert order.count("idle") == 10
    assert max(len(list(g)) for _, g in itertools.groupby(order)) <= 2


def test_charge_settles_actual_usage() -> None:
    q = queue()
    for _ in range(10):
        q.push(entry("a"), 0.0)
        q.push(entry("b"), 0.0)
    first = q.pop(0.0)
    assert first is not None and first.tenant == "a"
    q.charge("a", 500, tier="standard")  # it used 600 tokens, not 100: b catches up
    assert [q.pop(0.0).tenant for _ in range(7)] == ["b"] * 6 + ["a"]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="unknown tier"):
        q.charge("a", 1, tier="gold")


@pytest.mark.parametrize(("num_direct", "max_debt", "expected_a_after"), [
    pytest.param(0, 2.0, 0, id="no-direct-admission-no-debt"),
    pytest.param(1, 2.0, 1, id="one-direct-admission-one-request-behind"),
    pytest.param(5, 2.0, 2, id="debt-capped-at-two-requests"),
    pytest.param(5, 0.0, 0, id="cap-0-charges-nothing-past-virtual-time"),
])
def test_direct_admissions_count_against_the_tenant_bounded(
        num_direct: int, max_debt: float, expected_a_after: int) -> None:
    """Requests admitted while the tier's queue was empty put their tenant that many
    requests behind the others in the next busy period, at most ``max_direct_debt_requests``."""
    q = queue(max_direct_debt_requests=max_debt)
    for _ in range(num_direct):
        assert q.charge_direct("a", 100, "standard") == 100
    for i in range(4):
        q.push(entry("a", arrival_s=i), 1.0)
        q.push(entry("b", arrival_s=i), 1.0)
    order = [q.pop(1.0).tenant for _ in range(8)]  # type: ignore[union-attr]
    # b first while a pays off its debt (ties go to the earlier push: a), then they alternate
    assert order.index("a") == expected_a_after, order
    assert order.count("a") == order.count("b") == 4


def test_direct_admission_settles_like_a_dispatch() -> None:
    """charge_direct then charge(actual - charged) leaves what the actual usage says."""
    q = queue(max_direct_debt_requests=100.0)
    charged = q.charge_direct("a", 300, "standard", weight=2.0)
    q.charge("a", 100 - charged, "standard")  # it used 100 tokens: 50 of weighted debt
    for i in range(3):
        q.push(entry("a", cost=100, weight=2.0, arrival_s=i), 1.0)
        q.push(entry("b", cost=50, arrival_s=i), 1.0)
    assert [q.pop(1.0).tenant for _ in range(2)] == ["b", "a"]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="unknown tier"):
        q.charge_direct("a", 1, "gold")
    with pytest.raises(ValueError, match="max_direct_debt_requests"):
        queue(max_direct_debt_requests=-1.0)


def backlogged_tiers(q: FairQueue, tiers: tuple[str, ...], pops: int,
                     cost: dict[str, int]) -> Counter[str]:
    """Keep every tier in ``tiers`` backlogged for ``pops`` dispatches; tokens served per tier."""
    served: Counter[str] = Counter()
    for tier in tiers:
        q.push(entry(tier=tier, cost=cost[tier]), 0.0)
    for step in range(pops):
        e = q.pop(float(step))
        assert e is not None
        served[e.tier] += e.cost_tokens
        q.push(entry(tier=e.tier, cost=cost[e.tier], arrival_s=float(step)), float(step))
    return served


@pytest.mark.parametrize(
    ("share", "cost"),
    [
        pytest.param(0.05, {"interactive": 100, "batch": 100}, id="5pct-equal-costs"),
        pytest.param(0.2, {"interactive": 100, "batch": 700}, id="20pct-big-batch"),
        pytest.param(0.1, {"interactive": 900, "batch": 50}, id="10pct-small-batch"),
    ],
)
def test_lower_tier_gets_its_share_of_tokens(share: float, cost: dict[str, int]) -> None:
    q = queue(lower_tier_share=share)
    served = backlogged_tiers(q, ("interactive", "batch"), 2000, cost)
    ratio = share / (1 - share)
    # documented bound: r * top - max_lower_cost <= lower <= r * top
    assert ratio * served["interactive"] - cost["batch"] <= served["batch"]
    assert served["batch"] <= ratio * served["interactive"] + 1e-6


def test_strict_priority_without_share() -> None:
    q = queue(lower_tier_share=0.0)
    served = backlogged_tiers(q, ("interactive", "batch"), 500, {"interactive": 1, "batch": 1})
    assert served["batch"] == 0


def test_no_tier_starves_over_a_long_run() -> None:
    q = queue(lower_tier_share=0.05)
    cost = {"interactive": 200, "standard": 300, "batch": 100}
    served = backlogged_tiers(q, ("interactive", "standard", "batch"), 3000, cost)
    assert served["standard"] > 0 and served["batch"] > 0
    assert served["standard"] + served["batch"] >= 0.04 * sum(served.values())


def test_lower_tier_has_everything_when_higher_is_empty() -> None:
    q = queue()
    for tier in ("batch", "standard", "batch"):
        q.push(entry(tier=tier), 0.0)
    assert [e.tier for e in drain(q)] == ["standard", "batch", "batch"]


@pytest.mark.parametrize(
    ("config", "pushes", "accepted"),
    [
        pytest.param({"max_total": 3}, [("a", "batch")] * 5, 3, id="total"),
        pytest.param({"max_per_tier": 2}, [("a", "batch")] * 3 + [("a", "standard")], 3,
                     id="per-tier"),
        pytest.param({"tier_limits": {"batch": 1}}, [("a", "batch")] * 2 + [("a", "standard")],
                     2, id="tier-override"),
        pytest.param({"max_per_tenant": 2}, [("a", "batch")] * 3 + [("b", "batch")], 3,
                     id="per-tenant"),
    ],
)
def test_bounded_size(config: dict[str, object], pushes: list[tuple[str, str]],
                      accepted: int) -> None:
    q = queue(**config)
    results = [q.push(entry(tenant, tier), 0.0) for tenant, tier in pushes]
    assert sum(results) == accepted == len(q)


def test_remove_frees_room_and_is_never_popped() -> None:
    q = queue(max_total=2)
    a, b = entry("a", entry_id="x"), entry("b")
    assert q.push(a, 0.0) and q.push(b, 0.0) and not q.push(entry("c"), 0.0)
    assert q.remove("x") == a and "x" not in q
    assert q.remove("x") is None
    assert q.push(entry("c"), 0.0)
    assert [e.tenant for e in drain(q)] == ["b", "c"]
    assert q.push(entry("a", entry_id="x"), 0.0)  # an id may come back after it left


def test_expiry() -> None:
    q = queue()
    q.push(entry("a", deadline_s=5.0, entry_id="late"), 0.0)
    q.push(entry("a", deadline_s=2.0, entry_id="soon"), 0.0)
    q.push(entry("a", deadline_s=None, entry_id="never"), 0.0)
    assert q.expire(1.0) == []
    assert [e.entry_id for e in q.expire(2.0)] == ["soon"]
    # pop never returns an expired entry: it sets it aside for the next expire()
    assert q.pop(10.0).entry_id == "never"  # type: ignore[union-attr]
    assert [e.entry_id for e in q.expire(10.0)] == ["late"]
    assert len(q) == 0 and q.expire(99.0) == []


def test_lengths_and_num_ahead() -> None:
    q = queue()
    for tier in ("interactive", "standard", "standard", "batch"):
        q.push(entry(tier=tier), 0.0)
    assert q.lengths() == {"interactive": 1, "standard": 2, "batch": 1}
    assert q.num_ahead(TIERS["standard"]) == 3
    assert q.num_ahead(TIERS["interactive"]) == 1


def test_refuses_unknown_tier_and_duplicate_id() -> None:
    q = queue()
    with pytest.raises(ValueError, match="unknown tier"):
        q.push(entry(tier="gold"), 0.0)
    q.push(entry(entry_id="x"), 0.0)
    with pytest.raises(ValueError, match="already queued"):
        q.push(entry(entry_id="x"), 0.0)
    with pytest.raises(ValueError, match="lower_tier_share"):
        FairQueueConfig(lower_tier_share=1.0)


def test_churn_behind_a_waiting_head_stays_bounded() -> None:
    q = queue()
    q.push(entry("a", entry_id="head"), 0.0)
    for i in range(5000):
        q.push(entry("a", entry_id=f"c{i}", deadline_s=1e9), 0.0)
        q.remove(f"c{i}")
    assert len(q) == 1
    flow = q._levels["standard"].fair._flows["a"]
    assert len(flow.slots) < 100
    assert len(q._deadlines._items) < 200
    assert q.pop(0.0).entry_id == "head"  # type: ignore[union-attr]


def test_lazy_heap_orders_and_discards() -> None:
    heap: LazyHeap[str] = LazyHeap()
    handles = {name: heap.push(key, name) for key, name in [(2.0, "b"), (1.0, "a"), (2.0, "c")]}
    heap.discard(handles["a"])
    assert heap.peek() == (2.0, "b") and len(heap) == 2
    assert [heap.pop(), heap.pop(), heap.pop()] == [(2.0, "b"), (2.0, "c"), None]


def test_deterministic() -> None:
    def run() -> list[str]:
        rng = random.Random(2)
        q = queue(lower_tier_share=0.1)
        out = []
        for step in range(300):
            tier = rng.choice(["interactive", "standard", "batch"])
            q.push(entry(rng.choice("abc"), tier, rng.randrange(1, 500), float(step),
                         entry_id=f"{step}"), float(step))
            if step % 2 and (e := q.pop(float(step))) is not None:
                out.append(e.entry_id)
        return out + [e.entry_id for e in drain(q, 300.0)]

    assert run() == run()


def test_front_entries_leave_first_and_are_charged_to_their_tenant() -> None:
    queue = FairQueue(DEFAULT_TIERS)
    for i, tenant in enumerate(("a", "b", "a")):
        queue.push(QueueEntry(f"{tenant}-{i}", tenant, "standard", cost_tokens=100,
                              arrival_s=float(i)), float(i))
    queue.push(QueueEntry("b-back", "b", "standard", cost_tokens=100, arrival_s=5.0), 5.0,
               is_front=True)
    queue.push(QueueEntry("b-gone", "b", "standard", cost_tokens=100, arrival_s=5.5,
                          deadline_s=6.0), 5.5, is_front=True)
    assert queue.lengths()["standard"] == 5
    order = [e.entry_id for e in iter(lambda: queue.pop(7.0), None)]
    # the expired front entry never leaves; b's return was charged: b's next waits behind a's
    assert order == ["b-back", "a-0", "b-1", "a-2"]
    assert [e.entry_id for e in queue.expire(7.0)] == ["b-gone"]
    assert len(queue) == 0


def test_a_front_entry_can_be_removed() -> None:
    queue = FairQueue(DEFAULT_TIERS)
    queue.push(QueueEntry("x", "a", "batch", cost_tokens=1, arrival_s=0.0), 0.0, is_front=True)
    assert queue.remove("x") is not None
    assert queue.pop(1.0) is None and len(queue) == 0
