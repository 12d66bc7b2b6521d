"""The gateway's view of heartbeating workers (``FleetSync``), on a real Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
import redis.asyncio as aioredis

from backends.fleet.registry import BackendRegistry
from backends.fleet.sync import FleetSync
from backends.publisher import KvPublisher, WorkerIdentity, kv_stream_key, pack_hashes
from routing.index_exact import ExactPrefixIndex


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_finishes_seen_since_a_heartbeat_survive_polls_that_reread_it(
    redis: aioredis.Redis,
) -> None:
    # Heartbeats come every ~0.5 s, polls every 0.25 s: a poll often reads the same heartbeat
    # again. The finishes the gateway saw since then are still missing from its figures, so the
    # re-read must not forget them; a new heartbeat (which counts them) starts afresh.
    identity = WorkerIdentity(worker_id=f"w-{uuid.uuid4().hex[:8]}",
                              url=f"http://127.0.0.1:1/{uuid.uuid4().hex[:6]}", models=("m",),
                              profile={"num_kv_blocks": 64, "block_size": 16})
    publisher = KvPublisher(redis, identity, heartbeat_ttl_s=10.0)
    registry = BackendRegistry([])
    async with aiohttp.ClientSession() as session:
        sync = FleetSync(registry, redis, session)
        await publisher.heartbeat({"num_running": 4})
        await sync.poll_members()
        backend = registry.get(identity.worker_id)
        assert backend is not None and backend.state(0.0).num_running == 4

        backend.num_finished_since_load += 3  # the gateway saw three of them end
        await sync.poll_members()  # the same heartbeat, read again
        assert backend.num_finished_since_load == 3
        assert backend.state(0.0).num_running == 1

        await asyncio.sleep(0.002)  # a heartbeat of a later millisecond
        await publisher.heartbeat({"num_running": 1})
        await sync.poll_members()
        assert backend.num_finished_since_load == 0
        assert backend.state(0.0).num_running == 1
    await publisher.withdraw()


async def test_without_redis_only_listed_engines_are_followed() -> None:
    registry = BackendRegistry([])
    async with aiohttp.ClientSession() as session:
        sync = FleetSync(registry, None, session, discover_workers=True)
        await sync.poll_members()  # no Redis: nothing to read, nothing raised
        await sync.consume_kv_events()  # returns at once
        tasks = sync.start()
        try:
            assert sorted(t.get_name() for t in tasks) == ["fleet-metrics", "fleet-profiles"]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("plain_resp", [True, False], ids=["plain-resp", "redis-py"])
async def test_kv_events_reach_the_index_and_malformed_ones_are_skipped(
        redis: aioredis.Redis, plain_resp: bool) -> None:
    """A worker's KV events feed the exact index through the blocking read (its own plain
    connection, or redis-py's); entries no version wrote are counted and skipped, and the
    events after them still apply."""
    identity = WorkerIdentity(worker_id=f"w-{uuid.uuid4().hex[:8]}",
                              url=f"http://127.0.0.1:1/{uuid.uuid4().hex[:6]}", models=("m",),
                              profile={"num_kv_blocks": 64, "block_size": 16})
    publisher = KvPublisher(redis, identity, heartbeat_ttl_s=10.0)
    registry, index = BackendRegistry([]), ExactPrefixIndex()
    async with aiohttp.ClientSession() as session:
        sync = FleetSync(registry, redis, session, index=index, is_plain_resp=plain_resp)
        await publisher.heartbeat({"num_running": 0})
        await sync.poll_members()
        task = asyncio.create_task(sync.consume_kv_events())
        try:
            publisher.record("stored", [1, 2, 3])
            await publisher.flush()
            assert await _until(lambda: index.num_hashes(identity.worker_id) == 3)
            stream = kv_stream_key(identity.worker_id)
            for junk in ({"type": b"\xff", "h": b""}, {"h": pack_hashes([9])},
                         {"type": "stored", "h": b"\x01\x02\x03"}):
                await redis.xadd(stream, junk)  # type: ignore[arg-type]
            publisher.record("stored", [4, 5])
            await publisher.flush()
            assert await _until(lambda: index.num_hashes(identity.worker_id) == 5)
            assert sync.num_malformed_kv == 3
        finally:
            task.cancel()
            await asyncio.wait([task], timeout=5)  # bounded, as the gateway's shutdown is
        if plain_resp:  # redis-py may hold a cancelled read (the gateway gives up after 2 s)
            assert task.cancelled()
    await publisher.withdraw()


async def _until(predicate: Callable[[], bool], timeout_s: float = 3.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True
