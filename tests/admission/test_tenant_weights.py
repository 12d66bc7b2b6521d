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
    tenants = {"gold": tenant_principal("gold", gold_weight),
               "plain": tenant_principal("plain", plain_weight)}
    body = {"messages": [{"role": "user", "content": "the same prompt for everyone"}],
            "max_tokens": 16}
    served: list[str] = []

    async def request(tenant: str, request_id: str) -> None:
        plan = slo.router.describe("m", body, tenant)
        await slo.admit(TIERS["batch"], tenants[tenant], plan, request_id)
        served.append(tenant)

    tasks = [asyncio.create_task(request(tenant, f"{tenant}-{i}"))
             for i in range(NUM_PER_TENANT) for tenant in tenants]
    await asyncio.sleep(0.05)
    assert len(slo.queue) == 2 * NUM_PER_TENANT and not served
    queued = {slot.entry.tenant: slot.entry.weight for slot in slo.queue._slots.values()}
    assert queued == {"gold": gold_weight, "plain": plain_weight}

    worker.num_running = 3  # one slot frees; each dispatch pass releases one request
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
