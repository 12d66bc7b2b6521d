"""A backlogged lower tier is owed a floor of batch slots: the next free slot goes to it ahead
of the tiers above it (the top tier aside), and their direct admissions leave it that slot."""

from __future__ import annotations

import asyncio
import time

import pytest

from admission.fair_queue import FairQueue, QueueEntry
from admission.tiers import DEFAULT_TIERS, tier_table
from admission.waiting_room import Admitted, SloAdmission
from backends.fleet.registry import Backend
from tests.admission.one_worker import cancel_waiting, one_worker_slo, principal

TIERS = tier_table(DEFAULT_TIERS)
BODY = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def slo() -> tuple[SloAdmission, Backend]:
    """All 4 slots busy, one of them with a standard request this gateway admitted."""
    admission, worker = one_worker_slo()
    worker.load_observed_s = time.monotonic()
    worker.num_running, worker.num_finished_since_load = 3, 0
    worker.invalidate()
    await admit(admission, "standard", "s-0")
    assert admission.num_running_by_tier["standard"] == 1
    worker.num_running = 4
    worker.invalidate()
    return admission, worker


def admit(admission: SloAdmission, tier: str, request_id: str) -> asyncio.Task[Admitted]:
    plan = admission.fleet.describe("m", BODY, "t")
    return asyncio.create_task(admission.admit(TIERS[tier], principal().tenant, plan, request_id))


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_freed_slot_goes_to_the_starved_lower_tier_first(
        slo: tuple[SloAdmission, Backend]) -> None:
    admission, worker = slo
    batch = admit(admission, "batch", "b-1")
    await settle()
    standard = admit(admission, "standard", "s-1")
    await settle()
    assert "b-1" in admission.queue and "s-1" in admission.queue
    worker.num_running = 3  # one slot frees
    worker.invalidate()
    assert admission.dispatch(time.monotonic()) == 1
    await settle()
    assert batch.done() and not standard.done()
    assert admission.num_running_by_tier["batch"] == 1
    await cancel_waiting(standard)


async def test_a_direct_admission_leaves_the_owed_slot(
        slo: tuple[SloAdmission, Backend]) -> None:
    admission, worker = slo
    batch = admit(admission, "batch", "b-1")
    await settle()
    worker.num_running = 3  # a slot frees, the dispatcher has not looked yet
    worker.invalidate()
    standard = admit(admission, "standard", "s-1")
    await settle()
    assert not standard.done() and "s-1" in admission.queue  # it left the slot to batch
    assert admission.dispatch(time.monotonic()) == 1
    await settle()
    assert batch.done() and not standard.done()
    # batch holds its floor now: the next slot is standard's again
    worker.num_running = 2
    worker.invalidate()
    assert admission.owed_tier(admission._snapshot(time.monotonic())) is None
    assert admission.dispatch(time.monotonic()) == 1
    await settle()
    assert standard.done()


async def test_the_top_tier_is_not_held_for_the_floor(
        slo: tuple[SloAdmission, Backend]) -> None:
    admission, worker = slo
    batch = admit(admission, "batch", "b-1")
    await settle()
    worker.num_running = 3
    worker.invalidate()
    interactive = admit(admission, "interactive", "i-1")
    await settle()
    assert interactive.done() and "b-1" in admission.queue
    await interactive
    await cancel_waiting(batch)


async def test_a_queued_top_tier_request_goes_before_the_owed_tier(
        slo: tuple[SloAdmission, Backend]) -> None:
    admission, worker = slo
    admission.headroom_factor = 0.0  # no headroom held: only the queue's order protects it
    batch = admit(admission, "batch", "b-1")
    await settle()
    interactive = admit(admission, "interactive", "i-1")  # the fleet is full: it waits
    await settle()
    assert "i-1" in admission.queue and "b-1" in admission.queue
    assert admission.owed_tier(admission._snapshot(time.monotonic())) is not None
    worker.num_running = 3  # one slot frees
    worker.invalidate()
    assert admission.dispatch(time.monotonic()) == 1
    await settle()
    assert interactive.done() and not batch.done()
    await interactive
    await cancel_waiting(batch)


async def test_running_counts_settle_when_each_request_finishes(
        slo: tuple[SloAdmission, Backend]) -> None:
    admission, worker = slo
    worker.num_running = 0
    worker.invalidate()

    async def one_request(tier: str, request_id: str) -> None:
        plan = admission.fleet.describe("m", BODY, "t")
        admitted = await admission.admit(TIERS[tier], principal().tenant, plan, request_id)
        assert admission.num_running_by_tier[tier] >= 1
        admission.finished(admitted, 100)

    async def refused() -> None:  # finished() after a refusal settles nothing
        admission.finished(None, 100)

    await asyncio.gather(one_request("batch", "b-1"), one_request("standard", "s-1"),
                         refused())
    # only the fixture's s-0 is left: it never finished
    assert admission.num_running_by_tier == {"interactive": 0, "standard": 1, "batch": 0}


def test_pop_of_one_tier_takes_its_fair_head_only() -> None:
    queue = FairQueue(DEFAULT_TIERS)
    queue.push(QueueEntry("s-1", "a", "standard", cost_tokens=10, arrival_s=0.0), 0.0)
    queue.push(QueueEntry("b-1", "a", "batch", cost_tokens=10, arrival_s=1.0), 1.0)
    queue.push(QueueEntry("b-2", "b", "batch", cost_tokens=10, arrival_s=2.0), 2.0)
    popped = queue.pop(3.0, tier="batch")
    assert popped is not None and popped.entry_id == "b-1"
    assert queue.pop(3.0, tier="interactive") is None
    popped = queue.pop(3.0)
    assert popped is not None and popped.entry_id == "s-1"
