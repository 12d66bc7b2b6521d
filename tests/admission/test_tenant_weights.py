"""Tenant weights reach the fair queue: the gateway's SLO admission queues each request with
its tenant's weight, so a backlogged tenant of weight w gets w times the tokens of one of
weight 1 in its tier (the queue's own arithmetic: tests/admission/test_fair_queue.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter

import pytest

from admission.tiers import DEFAULT_TIERS, tier_table
from admission.waiting_room import Admitted, SloAdmission
from backends.fleet.registry import Backend
from gateway.auth import Principal
from tests.admission.one_worker import one_worker_slo, principal

TIERS = tier_table(DEFAULT_TIERS)
NUM_PER_TENANT = 30
NUM_SERVED = 30


def tenant_principal(tenant_id: str, weight: float) -> Principal:
    base = principal()
    tenant = dataclasses.replace(base.tenant, id=tenant_id, tier="batch", weight=weight)
    return Principal(tenant=tenant, key=dataclasses.replace(base.key, tenant_id=tenant_id))


@pytest.mark.parametrize(
    ("gold_weight", "plain_weight", "expected_gold"),
    [
        pytest.param(2.0, 1.0, 20, id="weight-2-gets-twice"),
        pytest.param(1.0, 1.0, 15, id="equal-weights-equal-shares"),
        pytest.param(1.0, 4.0, 6, id="weight-4-gets-four-times"),
        pytest.param(0.5, 0.25, 20, id="only-the-ratio-counts"),
    ],
)
async def test_backlogged_tenants_are_served_in_proportion_to_their_weights(
        gold_weight: float, plain_weight: float, expected_gold: int) -> None:
    slo, worker = one_worker_slo()
    worker.load_observed_s = time.monotonic()
    worker.num_running = 4  # the worker is full: every request queues in the gateway
    worker.invalidate()
    tenants = {"gold": tenant_principal("gold", gold_weight),
               "plain": tenant_principal("plain", plain_weight)}
    body = {"messages": [{"role": "user", "content": "the same prompt for everyone"}],
            "max_tokens": 16}
    served: list[str] = []

    async def request(tenant: str, request_id: str) -> None:
        plan = slo.fleet.describe("m", body, tenant)
        await slo.admit(TIERS["batch"], tenants[tenant].tenant, plan, request_id)
        served.append(tenant)

    tasks = [asyncio.create_task(request(tenant, f"{tenant}-{i}"))
             for i in range(NUM_PER_TENANT) for tenant in tenants]
    await asyncio.sleep(0.05)
    assert len(slo.queue) == 2 * NUM_PER_TENANT and not served
    queued = {slot.entry.tenant: slot.entry.weight for slot in slo.queue._slots.values()}
    assert queued == {"gold": gold_weight, "plain": plain_weight}

    worker.num_running = 3  # one slot frees; each dispatch pass releases one request
    worker.invalidate()
    for _ in range(NUM_SERVED):
        assert slo.dispatch(time.monotonic()) == 1
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    counts = Counter(served)
    assert sum(counts.values()) == NUM_SERVED
    # SFQ: |n_gold / w_gold - n_plain / w_plain| <= 1 / w_gold + 1 / w_plain (equal costs)
    assert abs(counts["gold"] - expected_gold) <= 1, counts
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


BODY = {"messages": [{"role": "user", "content": "the same prompt for everyone"}],
        "max_tokens": 64}


async def queue_requests(slo: SloAdmission, tenant: Principal, count: int,
                         served: list[str]) -> list[asyncio.Task[Admitted]]:
    """``count`` batch requests of ``tenant`` waiting in the queue (the worker is full)."""
    async def request(request_id: str) -> None:
        plan = slo.fleet.describe("m", BODY, tenant.tenant.id)
        await slo.admit(TIERS["batch"], tenant.tenant, plan, request_id)
        served.append(tenant.tenant.id)

    tasks = [asyncio.create_task(request(f"{tenant.tenant.id}-{i}")) for i in range(count)]
    await asyncio.sleep(0.01)
    return tasks


def release(slo: SloAdmission, worker: Backend, count: int) -> None:
    worker.num_running = 3  # one slot free: each dispatch pass releases one request
    worker.invalidate()
    for _ in range(count):
        assert slo.dispatch(time.monotonic()) == 1


async def test_requests_that_never_started_buy_their_tenant_no_credit() -> None:
    """A request refused, expired or abandoned in the queue was charged nothing, and its
    ``finished`` gives nothing back: a heavy tenant's many refusals once bought it a place
    ahead of everyone it shared the tier with."""
    slo, worker = one_worker_slo()
    worker.load_observed_s = time.monotonic()
    worker.num_running = 4
    worker.invalidate()
    heavy, plain = tenant_principal("heavy", 1.0), tenant_principal("plain", 1.0)
    served: list[str] = []
    tasks = (await queue_requests(slo, heavy, 4, served)
             + await queue_requests(slo, plain, 4, served))
    release(slo, worker, 2)
    await asyncio.sleep(0.01)
    assert served == ["heavy", "plain"]

    async def abandoned(request_id: str) -> None:  # as gateway/proxy.py does, in its finally
        plan = slo.fleet.describe("m", BODY, "heavy")
        admitted: Admitted | None = None
        try:
            admitted = await slo.admit(TIERS["batch"], heavy.tenant, plan, request_id)
        finally:
            slo.finished(admitted, plan.request.num_prompt_tokens)

    for round_ in range(4):  # one of heavy's requests gone before each dispatch
        gone = asyncio.create_task(abandoned(f"gone-{round_}"))
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        worker.num_running = 4
        worker.invalidate()
        release(slo, worker, 1)
        await asyncio.sleep(0.01)
    assert served[2:] == ["heavy", "plain", "heavy", "plain"]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_direct_admissions_put_their_tenant_behind_in_the_next_busy_period() -> None:
    """Two requests admitted at once (nothing queued) leave their tenant two requests behind
    one that had none, when both queue next (the debt is capped at two requests)."""
    slo, worker = one_worker_slo()
    worker.load_observed_s = time.monotonic()
    worker.num_running = 0
    worker.invalidate()
    heavy, plain = tenant_principal("heavy", 1.0), tenant_principal("plain", 1.0)
    for i in range(3):
        plan = slo.fleet.describe("m", BODY, "heavy")
        await slo.admit(TIERS["batch"], heavy.tenant, plan, f"direct-{i}")
    assert not len(slo.queue)
    worker.num_running = 4
    worker.invalidate()
    served: list[str] = []
    tasks = (await queue_requests(slo, heavy, 3, served)
             + await queue_requests(slo, plain, 3, served))
    release(slo, worker, 6)
    await asyncio.sleep(0.01)
    assert served == ["plain", "plain", "heavy", "plain", "heavy", "heavy"]
    await asyncio.gather(*tasks)
