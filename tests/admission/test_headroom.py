"""Headroom for higher tiers: arrival rates, reserved slots, free slots, and the gateway's
dispatcher holding the last free slots for interactive traffic."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from admission.fair_queue import FairQueue, QueueEntry
from admission.headroom import ArrivalRates, backend_free_slots, free_slots, reserved_slots
from admission.policy import AdmissionRequest, decide, fleet_free_slots
from admission.predictor import TtftPredictor
from admission.tiers import DEFAULT_TIERS, tier_table
from admission.waiting_room import SloAdmission
from backends.fleet.registry import Backend, BackendRegistry
from gateway.router import Router
from routing.index_approx import ApproxPrefixIndex
from routing.index_exact import ExactPrefixIndex
from routing.profiles import profile_by_name
from routing.types import BackendProfile, BackendState, FleetSnapshot, PrefixMatch
from tests.admission.one_worker import one_worker_slo, principal

TIERS = tier_table(DEFAULT_TIERS)
NOW_S = 1000.0


def backend(name: str = "w0", max_batch: int | None = 4, **fields: Any) -> BackendState:
    return BackendState(name=name, models=frozenset({"m"}),
                        profile=BackendProfile(max_batch=max_batch), **fields)


def snapshot(*backends: BackendState) -> FleetSnapshot:
    return FleetSnapshot(now_s=NOW_S, backends=backends, prefix=PrefixMatch(), max_age_s=5.0)


def rates_with(per_s: dict[str, float], tau_s: float = 10.0) -> ArrivalRates:
    """Rates built by steady arrivals over many time constants (they converge to per_s)."""
    rates = ArrivalRates(tau_s)
    for tier, rate in per_s.items():
        for i in range(int(rate * tau_s * 20)):
            rates.arrived(tier, NOW_S - tau_s * 20 + i / rate)
    return rates


def test_arrival_rate_converges_and_decays() -> None:
    rates = rates_with({"interactive": 4.0})
    assert rates.rate("interactive", NOW_S) == pytest.approx(4.0, rel=0.05)
    assert rates.rate("interactive", NOW_S + 10.0) == pytest.approx(4.0 / math.e, rel=0.05)
    assert rates.rate("batch", NOW_S) == 0.0
    with pytest.raises(ValueError, match="tau_s"):
        ArrivalRates(0.0)


@pytest.mark.parametrize(("tier", "per_s", "factor", "total", "expected"), [
    ("interactive", {"interactive": 4.0}, 1.0, 16, 0),  # the top tier keeps nothing
    ("standard", {"interactive": 4.0}, 1.0, 16, 2),     # 4/s x 0.5 s
    ("standard", {"interactive": 5.4}, 1.0, 16, 3),     # 2.7 -> 3
    ("standard", {"interactive": 4.0}, 0.0, 16, 0),     # turned off
    ("standard", {"batch": 50.0}, 1.0, 16, 0),          # nothing above standard
    ("batch", {"interactive": 4.0, "standard": 1.0}, 1.0, 16, 4),  # 2 + 1 x 2 s
    ("batch", {"interactive": 40.0}, 1.0, 16, 4),       # capped at a quarter of 16
    ("standard", {"interactive": 4.3}, 0.5, 16, 1),     # 1.075: the nearest slot, not 2
    ("standard", {"interactive": 6.4}, 0.5, 16, 2),     # 1.6 -> 2
    ("standard", {"interactive": 0.2}, 0.5, 16, 1),     # 0.05: still one slot
    ("standard", {"interactive": 4.0}, 0.5, 2, 0),      # a quarter of 2 slots: none
])
def test_reserved_slots(tier: str, per_s: dict[str, float], factor: float, total: int,
                        expected: int) -> None:
    rates = rates_with(per_s)
    assert reserved_slots(TIERS[tier], TIERS.values(), rates, NOW_S, total_slots=total,
                          factor=factor) == expected


@pytest.mark.parametrize(("state", "expected"), [
    (backend(), 4),
    (backend(num_running=3), 1),
    (backend(num_running=1, num_in_flight=3), 1),  # the gateway's fresher count wins
    (backend(num_running=4, num_waiting=2), 0),
    (backend(num_running=1, is_healthy=False), 0),
    (backend(num_running=1, age_s=60.0), 0),       # stale: no room counted
    (backend(max_batch=None), None),               # does not say: unknown
    # A stream of ours on its last step frees its slot as the step ends: a request sent now
    # starts in it then, so it counts as free; a request sent into it holds it again.
    (backend(num_running=4, num_in_flight=4, num_ending=1), 1),
    (backend(num_running=4, num_in_flight=5, num_ending=1), 0),
    (backend(num_running=4, num_in_flight=4, num_ending=1, num_waiting=1), 0),
])
def test_backend_free_slots(state: BackendState, expected: int | None) -> None:
    assert backend_free_slots(state, max_age_s=5.0) == expected


def test_fleet_free_slots() -> None:
    assert free_slots(snapshot(backend("a", num_running=1), backend("b", num_running=4))) == (3, 8)
    assert free_slots(snapshot(backend("a"), backend("b", max_batch=None))) is None
    assert free_slots(snapshot(backend("a")), model="other") == (0, 0)


@pytest.mark.parametrize(("backends", "expected"), [
    pytest.param((backend("a", num_running=1), backend("b", num_running=4)), (3, 8),
                 id="free-slots-of-backends-with-room"),
    # A heartbeat caught a request in a's queue: the dispatcher sends nothing there until the
    # next one, so its free slot is no room for anyone now.
    pytest.param((backend("a", num_running=2, num_waiting=1), backend("b", num_running=3)),
                 (1, 8), id="a-backend-with-a-queue-has-no-room"),
    pytest.param((BackendState(name="a", models=frozenset({"m"}), num_running=1,
                               kv_usage=1.0, profile=BackendProfile(
                                   max_batch=4, num_kv_blocks=1000, block_size=16)),
                  backend("b")), (4, 8), id="a-backend-out-of-kv-has-no-room"),
    # its KV capacity unknown, a free batch slot and an empty queue are the signal: a gauge
    # near 1.0 (engines' sit there under long-context load) does not take the slots away
    pytest.param((backend("a", num_running=1, kv_usage=0.99), backend("b")), (7, 8),
                 id="a-gauge-near-full-without-capacity-keeps-its-slots"),
    pytest.param((backend("a"), backend("b", max_batch=None)), None, id="unknown-room"),
])
def test_fleet_free_slots_counts_only_backends_with_room(
        backends: tuple[BackendState, ...], expected: tuple[int, int] | None) -> None:
    assert fleet_free_slots(snapshot(*backends)) == expected


def test_a_slot_the_dispatcher_cannot_fill_is_not_room_beyond_the_reserve() -> None:
    """One slot free on b, one on a behind a queued request: a standard request must leave
    b's slot to interactive (it is the only one anything can start in now)."""
    snap = snapshot(backend("a", num_running=2, num_waiting=1), backend("b", num_running=3))
    request = AdmissionRequest(tier=TIERS["standard"], tenant="t", prompt_tokens=200, model="m")
    held = decide(request, snap, TtftPredictor(), NOW_S, reserved_slots=1)
    assert held.action == "queue" and "held for higher tiers" in held.reason
    assert held.code == "held_for_higher"


def test_decide_leaves_the_reserved_slots_to_higher_tiers() -> None:
    snap = snapshot(backend("a", num_running=2), backend("b", num_running=4))  # 2 free
    request = AdmissionRequest(tier=TIERS["standard"], tenant="t", prompt_tokens=200, model="m")
    assert decide(request, snap, TtftPredictor(), NOW_S, reserved_slots=1).action == "admit"
    held = decide(request, snap, TtftPredictor(), NOW_S, reserved_slots=2)
    assert held.action == "queue"
    assert "held for higher tiers" in held.reason
    assert held.deadline_s is not None and held.deadline_s > NOW_S


def test_pop_leaves_lower_tiers_waiting_under_max_priority() -> None:
    q = FairQueue(TIERS.values())
    for i, tier in enumerate(("batch", "standard", "interactive")):
        assert q.push(QueueEntry(f"r{i}", "t", tier, cost_tokens=100, arrival_s=0.0), 0.0)
    assert q.pop(0.0, max_priority=TIERS["standard"].priority).entry_id == "r2"  # interactive
    assert q.pop(0.0, max_priority=TIERS["standard"].priority).entry_id == "r1"
    assert q.pop(0.0, max_priority=TIERS["standard"].priority) is None  # batch held back
    assert len(q) == 1
    assert q.pop(0.0).entry_id == "r0"


@pytest.fixture
def fleet() -> tuple[SloAdmission, Backend]:
    return one_worker_slo()


async def test_dispatcher_holds_the_last_slot_for_interactive(
        fleet: tuple[SloAdmission, Backend]) -> None:
    """With interactive traffic arriving, a standard request waits in the gateway while only
    the reserved slot is free, and goes once a second slot frees up."""
    slo, worker = fleet
    loop = asyncio.get_running_loop()
    worker.load_observed_s = loop.time()
    worker.num_running = 3  # one free slot of four
    worker.invalidate()
    for i in range(40):  # ~4 interactive arrivals per second lately
        slo.arrivals.arrived("interactive", loop.time() - 10 + i / 4)
    plan = slo.fleet.describe("m", {"messages": [{"role": "user", "content": "hi"}]}, "t")
    admitted = loop.create_task(slo.admit(TIERS["standard"], principal().tenant, plan, "std-1"))
    await asyncio.sleep(0.05)
    assert not admitted.done() and "std-1" in slo.queue
    assert slo.dispatch(loop.time()) == 0  # the one free slot stays free
    # An interactive request takes it at once: nothing is held for the top tier.
    plan_i = slo.fleet.describe("m", {"messages": [{"role": "user", "content": "now"}]}, "t")
    await asyncio.wait_for(
        slo.admit(TIERS["interactive"], principal().tenant, plan_i, "int-1"), 1.0)
    worker.num_running = 2  # two free: one beyond the reserve
    worker.load_observed_s = loop.time()
    worker.invalidate()
    assert slo.dispatch(loop.time()) == 1
    await asyncio.wait_for(admitted, 1.0)


async def test_a_waiting_interactive_request_gets_the_only_usable_slot(
        fleet: tuple[SloAdmission, Backend]) -> None:
    """The lower tiers' share credit would let a standard request overtake a waiting
    interactive one whenever the dispatcher thought two slots free; a slot on a worker with a
    queued request (from its last heartbeat) must not count as the second one."""
    slo, worker = fleet
    other = Backend(name="w1", url="http://127.0.0.1:9", models=frozenset({"m"}),
                    profile=BackendProfile(max_batch=4))
    slo.fleet.registry.add(other)
    loop = asyncio.get_running_loop()
    for backend_ in (worker, other):
        backend_.load_observed(time.monotonic())
    worker.num_running, worker.num_waiting = 2, 1  # a free slot, but a request in its queue
    worker.invalidate()
    other.num_running = 4
    other.invalidate()
    for i in range(40):
        slo.arrivals.arrived("interactive", time.monotonic() - 10 + i / 4)
    slo.queue._credit_tokens = 1e9  # standard has earned its share many times over
    plans = {}
    for tier, request_id in (("standard", "std-1"), ("interactive", "int-1")):
        plans[request_id] = loop.create_task(slo.admit(
            TIERS[tier], principal().tenant,
            slo.fleet.describe("m", {"messages": [{"role": "user", "content": tier}]}, "t"),
            request_id))
        await asyncio.sleep(0.01)
    assert "std-1" in slo.queue and "int-1" in slo.queue
    other.num_running = 3  # a stream on w1 ends: the one slot anything can start in
    other.invalidate()
    assert slo.dispatch(time.monotonic()) == 1
    await asyncio.wait_for(plans["int-1"], 1.0)
    assert "std-1" in slo.queue
    plans["std-1"].cancel()


def test_an_admitted_request_goes_to_a_backend_with_a_free_slot() -> None:
    """prefix_affinity would pick the backend holding the prefix; admitted to start now, the
    request goes to the one with a free batch slot instead of queueing in the full one."""
    full = Backend(name="warm", url="http://127.0.0.1:9", models=frozenset({"m"}),
                   profile=BackendProfile(max_batch=2), num_running=2)
    idle = Backend(name="cold", url="http://127.0.0.1:9", models=frozenset({"m"}),
                   profile=BackendProfile(max_batch=2))
    router = Router(BackendRegistry([full, idle]), profile_by_name("prefix_affinity"),
                    ExactPrefixIndex(block_size=16), ApproxPrefixIndex(), {}, seed=1)
    for backend in (full, idle):
        backend.load_observed(time.monotonic())  # the router's clock
    body = {"messages": [{"role": "user", "content": "a long shared system prompt " * 40}]}
    warm_up = router.describe("m", body, "t")
    router.started(full, warm_up)  # the approximate index now says "warm" holds the prefix
    router.finished(full, warm_up, had_first_token=True)
    full.num_running, full.num_finished_since_load = 2, 0  # a fresh heartbeat: full
    full.invalidate()
    assert router.rank(router.describe("m", body, "t"))[0][0] is full  # affinity alone
    plan = router.describe("m", body, "t")
    plan.needs_free_slot = True
    assert router.rank(plan)[0][0] is idle
    idle.num_running = 2  # both full: no filtering, affinity decides again
    idle.invalidate()
    plan = router.describe("m", body, "t")
    plan.needs_free_slot = True
    assert router.rank(plan)[0][0] is full
