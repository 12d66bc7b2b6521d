"""Tenant weights through a real gateway: set by the admin API, they decide the order in which
backlogged tenants of one tier leave the gateway's queue for a one-slot engine."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.cli.localproc import ProcessGroup
from tests.fleet import Engine, Gateway, wait_until

NUM_PER_TENANT = 20
NUM_COUNTED = 20
TOKEN_DELAY_MS = 20


@pytest.fixture(scope="module")
def one_slot(workdir: Path, redis_url: str) -> Iterator[tuple[Gateway, Engine]]:
    """A gateway over one engine that serves one request at a time, loaded by the gateway's
    own books (the engine has no metrics)."""
    with ProcessGroup() as group:
        engine = Engine(group, "one-slot", extra=(
            "--no-metrics", "--token-delay-ms", str(TOKEN_DELAY_MS)))
        backend = {**engine.backend_config(), "profile": {"max_batch": 1}}
        gateway = Gateway(group, workdir, redis_url, backends=[backend],
                          routing={"discover_workers": False})
        yield gateway, engine


def queued_batch(gateway: Gateway) -> int:
    metrics = httpx.get(gateway.url + "/metrics", timeout=5).text
    match = re.search(r'^switchyard_admission_queue_length\{tier="batch"\} (\S+)$', metrics,
                      re.MULTILINE)
    return int(float(match.group(1))) if match else 0


async def served_order(gateway: Gateway, engine: Engine, keys: dict[str, str],
                       blocker_key: str) -> list[str]:
    """Hold the slot, queue NUM_PER_TENANT requests per tenant, release: who finished when."""
    finished: list[tuple[float, str]] = []

    async def chat(client: httpx.AsyncClient, key: str, max_tokens: int) -> None:
        response = await client.post("/v1/chat/completions", headers={
            "Authorization": f"Bearer {key}"}, json={
            "model": engine.models[0], "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "the same prompt for everyone"}]})
        assert response.status_code == 200, response.text

    async def timed(client: httpx.AsyncClient, tenant: str) -> None:
        await chat(client, keys[tenant], 1)
        finished.append((time.monotonic(), tenant))

    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60, limits=limits) as client:
        blocker = asyncio.create_task(chat(client, blocker_key, 100))  # ~2 s in the slot
        while engine.stats()["in_flight"] != 1:
            await asyncio.sleep(0.01)
        tasks = [asyncio.create_task(timed(client, tenant))
                 for _ in range(NUM_PER_TENANT) for tenant in keys]
        deadline = time.monotonic() + 5
        while queued_batch(gateway) < len(tasks):
            assert not blocker.done(), "the slot freed before every request was queued"
            assert time.monotonic() < deadline, f"{queued_batch(gateway)} queued"
            await asyncio.sleep(0.02)
        await asyncio.gather(blocker, *tasks)
    return [tenant for _, tenant in sorted(finished)]


@pytest.mark.parametrize(
    ("weights", "set_by_update", "expected_gold"),
    [
        pytest.param((3.0, 1.0), False, 15, id="weight-3-gets-three-times"),
        pytest.param((3.0, 1.0), True, 15, id="weight-changed-by-update"),
        pytest.param((1.0, 1.0), False, 10, id="equal-weights-equal-shares"),
    ],
)
def test_backlogged_tenants_share_one_slot_by_weight(
    one_slot: tuple[Gateway, Engine], weights: tuple[float, float], set_by_update: bool,
    expected_gold: int,
) -> None:
    gateway, engine = one_slot
    keys = {}
    for tenant, weight in zip(("gold", "plain"), weights, strict=True):
        record = gateway.create_tenant(tier="batch", weight=1.0 if set_by_update else weight)
        keys[tenant] = gateway.create_key(record["id"])
        # the gateway caches the tenant with its key: the update must reach that cache
        assert httpx.get(gateway.url + "/v1/models", timeout=5,
                         headers={"Authorization": f"Bearer {keys[tenant]}"}).status_code == 200
        if set_by_update:
            response = gateway.admin.patch(f"/admin/tenants/{record['id']}",
                                           json={"weight": weight})
            assert response.json()["weight"] == weight
    blocker_key = gateway.new_key(tier="batch")
    if set_by_update:
        time.sleep(0.2)  # the invalidation is a pub/sub message away

    order = asyncio.run(served_order(gateway, engine, keys, blocker_key))
    assert len(order) == 2 * NUM_PER_TENANT
    num_gold = order[:NUM_COUNTED].count("gold")
    # SFQ with equal costs: |n_gold / w_gold - n_plain / w_plain| <= 1 / w_gold + 1 / w_plain
    assert abs(num_gold - expected_gold) <= 1, order
    assert wait_until(lambda: queued_batch(gateway) == 0)
