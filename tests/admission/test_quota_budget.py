"""Quota budgets on a real redis-server: a busy tenant's credit drawn in blocks and spent in the
replica, never over a limit, nothing lost, given back when idle (admission/quota/budget.py)."""

from __future__ import annotations

import asyncio
import math

import redis.asyncio as aioredis

from admission.quota.budget import BLOCK_SHARE, KEEP_BLOCKS, SLOT_SHARE, Budget
from admission.quota.store import QuotaLimits, QuotaStore, quota_keys
from tests.admission.held import held_async, rid


async def debt_ms(client: aioredis.Redis, key: str) -> float:
    """A GCRA key's debt now, in ms (0 when absent), as the script computes it."""
    fields = await client.hmget(key, "d", "t")
    if fields[0] is None:
        return 0.0
    seconds, micros = await client.time()
    return max(0.0, float(fields[0]) - (seconds * 1e6 + micros - float(fields[1]))) / 1000


async def test_a_busy_tenant_is_served_from_its_budget_and_nothing_is_lost(
        redis: aioredis.Redis, tenant: str) -> None:
    """400 acquire + settle pairs of a tenant far from its limits: most spend the replica's
    budget (a Redis call per block, not per request). Closed, the store gives the credit
    back: Redis then holds the requests' charges and the tokens they used, and no slot."""
    limits = QuotaLimits(requests_per_minute=600_000, tokens_per_minute=60_000_000,
                         max_concurrent=5_000)
    store = QuotaStore(redis)
    started = asyncio.get_running_loop().time()
    for _ in range(400):
        request_id = rid()
        decision = await store.acquire(tenant, limits, tokens=1000, request_id=request_id)
        assert decision.is_allowed and decision.limit_requests == 600_000
        store.settle_soon(tenant, limits, reserved_tokens=1000, actual_tokens=100,
                          request_id=request_id)
    counters = store.counters()
    assert counters["num_spent_here"] >= 300
    assert counters["num_redis_round_trips"] <= 60
    await store.aclose()
    req_key, tok_key, _ = quota_keys(tenant)
    req_ms, tok_ms = await debt_ms(redis, req_key), await debt_ms(redis, tok_key)
    elapsed_ms = (asyncio.get_running_loop().time() - started) * 1000
    # 400 requests of 0.1 ms and 40,000 tokens of 1 µs, less the refill since (≤ elapsed).
    assert 40 - elapsed_ms - 0.01 <= req_ms <= 40 + 0.01
    assert 40 - elapsed_ms - 0.01 <= tok_ms <= 40 + 0.01
    assert await held_async(redis, tenant) == 0


async def test_replicas_together_never_exceed_a_limit(redis: aioredis.Redis,
                                                      tenant: str) -> None:
    """Two replicas, each with a warm budget, race 600 held acquires against
    max_concurrent=1280: never more than 1280 in, and at most the blocks each replica keeps
    (twice 1280 / SLOT_SHARE slots) short of it. Settled, Redis counts no slot beyond
    them."""
    limit = 1280
    limits = QuotaLimits(max_concurrent=limit)
    one, two = QuotaStore(redis), QuotaStore(redis)
    for store in (one, two):  # warm: the next draws ask for blocks
        for _ in range(3):
            request_id = rid()
            assert (await store.acquire(tenant, limits, tokens=0,
                                        request_id=request_id)).is_allowed
            await store.settle(tenant, limits, reserved_tokens=0, actual_tokens=0,
                               request_id=request_id)

    async def burst(store: QuotaStore) -> list[str]:
        admitted = []
        for _ in range(10):
            ids = [rid() for _ in range(60)]
            decisions = await asyncio.gather(*[
                store.acquire(tenant, limits, tokens=0, request_id=request_id)
                for request_id in ids])
            admitted += [i for i, d in zip(ids, decisions, strict=True) if d.is_allowed]
        return admitted

    held = await asyncio.gather(burst(one), burst(two), burst(one), burst(two))
    num_in = sum(len(ids) for ids in held)
    assert limit - 2 * KEEP_BLOCKS * (limit // SLOT_SHARE) <= num_in <= limit
    # A refused acquire counted the ones still out with it; the counts sent after it
    # (within settle_delay_s) correct Redis to what each replica holds.
    await asyncio.sleep(0.1)
    most_kept = 2 * KEEP_BLOCKS * (limit // SLOT_SHARE)  # two replicas' spare slots
    assert num_in <= await held_async(redis, tenant) <= num_in + most_kept
    assert one.counters()["num_spent_here"] + two.counters()["num_spent_here"] > 0
    for store, ids in zip((one, two, one, two), held, strict=True):
        for request_id in ids:
            store.settle_soon(tenant, limits, reserved_tokens=0, actual_tokens=0,
                              request_id=request_id)
    await asyncio.sleep(0.1)
    assert await held_async(redis, tenant) <= 2 * KEEP_BLOCKS * (limit // SLOT_SHARE)
    for store in (one, two):
        await store.aclose()
    assert await held_async(redis, tenant) == 0


async def test_near_a_limit_every_request_is_judged_in_redis(redis: aioredis.Redis,
                                                             tenant: str) -> None:
    """A limit under BLOCK_SHARE has no blocks: the burst is exact, as without budgets, and
    the refusal's wait is Redis's."""
    store = QuotaStore(redis)
    limits = QuotaLimits(requests_per_minute=BLOCK_SHARE - 1)
    decisions = [await store.acquire(tenant, limits, tokens=0, request_id=rid())
                 for _ in range(BLOCK_SHARE)]
    assert [d.is_allowed for d in decisions] == [True] * (BLOCK_SHARE - 1) + [False]
    assert store.counters()["num_spent_here"] == 0
    assert decisions[-1].retry_after_ms is not None and decisions[-1].retry_after_ms > 0
    await store.aclose()


async def test_an_idle_budget_is_given_back(redis: aioredis.Redis, tenant: str) -> None:
    """Credit and spare slots held for the next requests go back to Redis once the tenant
    has been idle for idle_s; the budget itself is dropped after."""
    limits = QuotaLimits(requests_per_minute=2560, max_concurrent=5_000)
    step_ms = 60_000 / 2560
    store = QuotaStore(redis, idle_s=0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    ids = [rid() for _ in range(50)]
    for request_id in ids:
        assert (await store.acquire(tenant, limits, tokens=0, request_id=request_id)).is_allowed
    ended = loop.time()
    assert store.counters()["num_spent_here"] > 25
    for request_id in ids[1:]:
        store.settle_soon(tenant, limits, reserved_tokens=0, actual_tokens=0,
                          request_id=request_id)
    await asyncio.sleep(0.1)
    req_key = quota_keys(tenant)[0]
    # The 50 requests' charges, less the refill since the first, and credit for 10 more.
    charged_ms = 50 * step_ms - (loop.time() - started) * 1000
    assert await debt_ms(redis, req_key) >= charged_ms + 10 * step_ms
    assert await held_async(redis, tenant) > 1  # spare slots kept for the next requests
    await asyncio.sleep(0.6)
    debt = await debt_ms(redis, req_key)
    assert debt <= 50 * step_ms - (loop.time() - ended) * 1000 + 0.01  # the credit is back
    assert await held_async(redis, tenant) == 1  # the one still in flight
    await store.settle(tenant, limits, reserved_tokens=0, actual_tokens=0, request_id=ids[0])
    assert await held_async(redis, tenant) == 0
    await asyncio.sleep(0.6)
    assert store.num_budgets == 0  # dropped once empty and idle
    await store.aclose()


async def test_a_count_spent_here_is_renewed_in_redis(redis: aioredis.Redis,
                                                      tenant: str) -> None:
    """Requests served from spare slots write nothing to Redis; the sweep renews the
    replica's count every lease_ttl / 3, so a long run of them never lets it expire."""
    limits = QuotaLimits(max_concurrent=5_000)
    store = QuotaStore(redis, lease_ttl_s=0.3)
    for _ in range(5):  # warm: blocks of spare slots
        request_id = rid()
        await store.acquire(tenant, limits, tokens=0, request_id=request_id)
        await store.settle(tenant, limits, reserved_tokens=0, actual_tokens=0,
                           request_id=request_id)
    spent_before = store.counters()["num_spent_here"]
    for _ in range(8):  # 0.8 s: past two TTLs
        await asyncio.sleep(0.1)
        request_id = rid()
        assert (await store.acquire(tenant, limits, tokens=0, request_id=request_id)).is_allowed
        assert await held_async(redis, tenant) >= 1  # counted, though spent here
        store.settle_soon(tenant, limits, reserved_tokens=0, actual_tokens=0,
                          request_id=request_id)
    assert store.counters()["num_spent_here"] == spent_before + 8
    await store.aclose()


def test_block_sizes_follow_the_rate_within_the_limits() -> None:
    budget = Budget((6_000_000, 600_000_000, 100_000), now_s=0.0)
    assert budget.want(0.0, 0.1) == (0, 0, 0)  # the first draw: no rate known yet
    for _ in range(10):
        budget.counted(500, now_s=0.01)
    assert budget.want(0.01, 0.1) == (20, 10_000, 20)  # faster than a block lasts: doubles
    for _ in range(10):
        budget.counted(500, now_s=0.5)
    assert budget.want(1.01, 0.1) == (1, 500, 1)  # 10 per s for 0.1 s
    small = Budget((1000, 100_000, 64), now_s=0.0)
    small.want(0.0, 0.1)
    for _ in range(100):
        small.counted(100, now_s=0.001)
    assert small.want(0.001, 0.1) == (1000 // BLOCK_SHARE, 100_000 // BLOCK_SHARE,
                                      64 // SLOT_SHARE)


async def test_headers_of_requests_admitted_here(redis: aioredis.Redis, tenant: str) -> None:
    """A request spent from the budget reports what Redis would: the requests remaining after
    it (plus at most the refill since the burst began) and a reset that grows with the
    debt."""
    rpm = 100 * BLOCK_SHARE
    limits = QuotaLimits(requests_per_minute=rpm)
    store = QuotaStore(redis)
    loop = asyncio.get_running_loop()
    started = loop.time()
    decisions = [await store.acquire(tenant, limits, tokens=0, request_id=rid())
                 for _ in range(60)]
    refill = math.ceil((loop.time() - started) * rpm / 60) + 1
    assert store.counters()["num_spent_here"] > 30
    for number, decision in enumerate(decisions, start=1):
        assert decision.limit_requests == rpm
        assert rpm - number <= (decision.remaining_requests or 0) <= rpm - number + refill
    step_ms = 60_000 / rpm
    assert 60 * step_ms - refill * step_ms <= (decisions[-1].reset_requests_ms or 0) \
        <= 60 * step_ms + 1
    await store.aclose()
