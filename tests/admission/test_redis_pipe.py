"""The quota store's own Redis connection (admission/quota/redis_pipe.py), on real redis-servers:
AUTH and SELECT, timeouts that close the connection, reconnects, and settles
queued without a task. The scheduling shared with redis-py's path is in test_redis_batch.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from admission.quota.lua import OPS_SCRIPT
from admission.quota.redis_pipe import RespScriptPipe
from admission.quota.store import QuotaLimits, QuotaStore, ops_keys, quota_keys
from backends.resp import RespAddress
from gateway.cli.localproc import ProcessGroup
from tests.admission.held import held_async

COUNT_OP = (1000, 1000, "replica-x", "H", 1, 0)  # OPS_SCRIPT's header and one count op


@pytest.fixture
async def redis(private_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(private_redis_url)
    yield client
    await client.aclose()


def rid() -> str:
    return uuid.uuid4().hex


def new_tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


async def test_auth_and_select(redis: aioredis.Redis) -> None:
    """A password and a database number in the URL: the store's connection sends AUTH and
    SELECT first, and its keys land in that database."""
    port = redis.connection_pool.connection_kwargs["port"]
    await redis.config_set("requirepass", "s3cret")
    try:
        client = aioredis.Redis.from_url(f"redis://:s3cret@127.0.0.1:{port}/5")
        store, tenant = QuotaStore(client), new_tenant()
        decision = await store.acquire(tenant, QuotaLimits(requests_per_minute=10), tokens=0,
                                       request_id=rid())
        assert decision.is_allowed and not decision.is_local
        assert await client.exists(quota_keys(tenant)[0]) == 1
        wrong = QuotaStore(aioredis.Redis.from_url(f"redis://:nope@127.0.0.1:{port}/5"),
                           timeout_s=0.5)
        refused = await wrong.acquire(tenant, QuotaLimits(requests_per_minute=10), tokens=0,
                                      request_id=rid())
        assert refused.is_local and wrong.is_redis_down  # a bad password is an outage
        await store.aclose()
        await wrong.aclose()
        await client.aclose()
    finally:
        authed = aioredis.Redis.from_url(f"redis://:s3cret@127.0.0.1:{port}")
        await authed.config_set("requirepass", "")
        await authed.aclose()
    assert await redis.exists(quota_keys(tenant)[0]) == 0  # not in database 0


async def test_a_late_answer_closes_the_connection_and_the_next_call_reconnects(
        redis: aioredis.Redis) -> None:
    """Redis paused past the timeout: the call fails over to the local limiter at once and the
    connection is dropped (its late replies would be out of step); Redis drops a paused
    client's command with its connection, so the next call, on a new connection, finds only
    the first charge."""
    store = QuotaStore(redis, timeout_s=0.2, outage_retry_s=0.0)
    limits, tenant = QuotaLimits(requests_per_minute=10), new_tenant()  # one per 6 s
    assert (await store.acquire(tenant, limits, tokens=0, request_id=rid())).remaining_requests \
        == 9
    await redis.execute_command("CLIENT", "PAUSE", 600, "WRITE")
    started = time.perf_counter()
    late = await store.acquire(tenant, limits, tokens=0, request_id=rid())
    assert 0.15 < time.perf_counter() - started < 0.45
    assert late.is_local and store.is_redis_down
    await asyncio.sleep(0.6)
    back = await store.acquire(tenant, limits, tokens=0, request_id=rid())
    assert not back.is_local and back.remaining_requests == 8 and not store.is_redis_down
    assert store.counters()["num_outages"] == 1
    await store.aclose()


async def test_settle_soon_releases_without_a_task(redis: aioredis.Redis) -> None:
    """``settle_soon`` queues the settle (no task, no await): it rides with the next acquire,
    which then finds the slot free; with nothing to ride with it leaves after its delay."""
    store = QuotaStore(redis, settle_delay_s=0.2)
    limits, tenant = QuotaLimits(tokens_per_minute=1000, max_concurrent=1), new_tenant()
    # Load the scripts first: a settle answered NOSCRIPT is sent again after the acquire.
    await store.settle(tenant, limits, reserved_tokens=0, actual_tokens=0, request_id=rid())
    first = rid()
    assert (await store.acquire(tenant, limits, tokens=500, request_id=first)).is_allowed
    tasks_before = len(asyncio.all_tasks())
    trips_before = store.counters()["num_redis_round_trips"]
    store.settle_soon(tenant, limits, reserved_tokens=500, actual_tokens=100, request_id=first)
    assert len(asyncio.all_tasks()) == tasks_before
    second = await store.acquire(tenant, limits, tokens=500, request_id=rid())
    assert second.is_allowed and second.num_leases == 1
    assert 395 <= (second.remaining_tokens or 0) <= 400  # 1000 - 100 - 500, refilling
    assert store.counters()["num_redis_round_trips"] == trips_before + 1
    store.settle_soon(tenant, limits, reserved_tokens=500, actual_tokens=500,
                      request_id=rid())  # holds nothing, refunds nothing: no op at all
    await asyncio.sleep(0.3)
    assert store.counters()["num_redis_round_trips"] == trips_before + 1
    assert await held_async(redis, tenant) == 1 and not store.is_redis_down
    await store.aclose()


async def test_closing_sends_what_is_deferred_then_fails_what_is_unanswered(
        redis: aioredis.Redis, private_redis_url: str, procs: ProcessGroup) -> None:
    address = RespAddress.of(redis)
    assert address is not None
    pipe = RespScriptPipe(address, timeout_s=1.0)
    assert await pipe.run(OPS_SCRIPT, ops_keys("x"), COUNT_OP) in (b"0", b"1")
    deferred = pipe.defer(OPS_SCRIPT, ops_keys("x"), COUNT_OP, 10.0)
    await pipe.aclose()
    assert deferred.done() and deferred.result() == b"1"  # sent and answered, not dropped

    # A Redis that does not answer: closing waits only flush_timeout_s, then fails the call.
    pipe = RespScriptPipe(address, timeout_s=5.0)
    assert await pipe.run(OPS_SCRIPT, ops_keys("x"), COUNT_OP) == b"1"
    stalled = pipe.defer(OPS_SCRIPT, ops_keys("x"), COUNT_OP, 10.0)
    await redis.execute_command("CLIENT", "PAUSE", 1000, "ALL")
    try:
        started = time.monotonic()
        await pipe.aclose(flush_timeout_s=0.2)
        assert time.monotonic() - started < 0.9
    finally:
        await redis.execute_command("CLIENT", "UNPAUSE")
    with pytest.raises(RedisConnectionError):
        await stalled


async def test_closing_the_store_settles_the_last_requests(redis: aioredis.Redis) -> None:
    store = QuotaStore(redis, settle_delay_s=10.0)
    limits, tenant = QuotaLimits(max_concurrent=1), new_tenant()
    request_id = rid()
    assert (await store.acquire(tenant, limits, tokens=10, request_id=request_id)).is_allowed
    store.settle_soon(tenant, limits, reserved_tokens=10, actual_tokens=10,
                      request_id=request_id)
    assert await held_async(redis, tenant) == 1
    await store.aclose()
    assert await held_async(redis, tenant) == 0
