"""The worker contract in Redis: heartbeats, KV events and snapshots, on a real redis-server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import orjson
import pytest
import redis.asyncio as aioredis

from backends.publisher import (
    WORKERS_ZSET,
    KvPublisher,
    WorkerIdentity,
    kv_snapshot_key,
    kv_stream_key,
    unpack_hashes,
    worker_key,
)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def _publisher(redis: aioredis.Redis, **kwargs: float) -> KvPublisher:
    identity = WorkerIdentity(
        worker_id=f"w-{uuid.uuid4().hex[:8]}", url="http://127.0.0.1:19001",
        models=("m",), profile={"num_kv_blocks": 64, "block_size": 16},
    )
    return KvPublisher(redis, identity, **kwargs)


async def _replay(redis: aioredis.Redis, worker_id: str) -> set[int]:
    """What a gateway does: load the snapshot, then apply the stream after its id."""
    snapshot = await redis.hgetall(kv_snapshot_key(worker_id))  # type: ignore[misc]
    resident = set(unpack_hashes(snapshot[b"h"])) if snapshot else set()
    after = snapshot[b"after_id"] if snapshot else b"0-0"
    for _, fields in await redis.xrange(kv_stream_key(worker_id), min=b"(" + after):
        hashes = unpack_hashes(fields[b"h"])
        if fields[b"type"] == b"stored":
            resident.update(hashes)
        elif fields[b"type"] == b"removed":
            resident.difference_update(hashes)
        else:
            resident.clear()
    return resident


async def test_events_and_snapshot_reconstruct_the_resident_set(redis: aioredis.Redis) -> None:
    publisher = _publisher(redis)
    wid = publisher.identity.worker_id
    publisher.record("stored", [1, 2, 3])
    publisher.record("removed", [2])
    await publisher.flush(resident_hashes=lambda: [1, 3])
    publisher.record("stored", [2**64 - 1, 7])
    publisher.record("removed", [1])
    await publisher.flush()
    entries = await redis.xrange(kv_stream_key(wid))
    types = [fields[b"type"] for _, fields in entries]
    assert types == [b"cleared", b"stored", b"removed", b"stored", b"removed"]
    assert unpack_hashes(entries[3][1][b"h"]) == [2**64 - 1, 7]
    assert {fields[b"epoch"] for _, fields in entries} == {publisher.epoch.encode()}
    assert await _replay(redis, wid) == {3, 2**64 - 1, 7}


async def test_a_flush_wakes_a_blocked_reader_once_with_every_event(
        redis: aioredis.Redis, redis_url: str) -> None:
    """A gateway blocked in XREAD on the worker's stream gets a flush's events in one reply
    (a transaction: after each command of a plain pipeline Redis would answer it)."""
    publisher = _publisher(redis)
    stream = kv_stream_key(publisher.identity.worker_id)
    reader = aioredis.Redis.from_url(redis_url)
    read = asyncio.create_task(reader.xread({stream: "$"}, count=100, block=5000))
    await asyncio.sleep(0.1)
    publisher.record("stored", [1, 2, 3])
    publisher.record("removed", [2])
    publisher.record("stored", [4])
    await publisher.flush()
    ((_, entries),) = await asyncio.wait_for(read, 3)
    assert [fields[b"type"] for _, fields in entries] == [
        b"cleared", b"stored", b"removed", b"stored"]  # a new epoch starts cleared
    await reader.aclose()


async def test_heartbeat_document_ttl_and_membership(redis: aioredis.Redis) -> None:
    publisher = _publisher(redis, heartbeat_ttl_s=3.0)
    wid = publisher.identity.worker_id
    await publisher.heartbeat({"num_running": 2, "num_waiting": 1, "kv_usage": 0.25,
                               "num_queued_prefill_tokens": 300})
    doc = orjson.loads(await redis.get(worker_key(wid)))
    assert doc["id"] == wid and doc["url"] == "http://127.0.0.1:19001"
    assert doc["models"] == ["m"] and doc["profile"]["num_kv_blocks"] == 64
    assert doc["load"]["num_queued_prefill_tokens"] == 300
    assert doc["hash_version"] == "switchyard-prefix-v1"
    assert 0 < await redis.pttl(worker_key(wid)) <= 3000
    assert await redis.zscore(WORKERS_ZSET, wid) == doc["ts_ms"]
    await publisher.withdraw()
    assert await redis.get(worker_key(wid)) is None
    assert await redis.zscore(WORKERS_ZSET, wid) is None


async def test_run_loop_publishes_until_cancelled(redis: aioredis.Redis) -> None:
    publisher = _publisher(redis, heartbeat_interval_s=0.05, flush_interval_s=0.01,
                           snapshot_interval_s=0.05)
    wid = publisher.identity.worker_id
    resident = [10, 11]
    task = asyncio.create_task(publisher.run(lambda: {"num_running": 0}, lambda: resident))
    try:
        publisher.record("stored", [10, 11])
        for _ in range(200):
            if await redis.exists(kv_snapshot_key(wid)) and await redis.exists(worker_key(wid)):
                break
            await asyncio.sleep(0.01)
        assert await _replay(redis, wid) == {10, 11}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
