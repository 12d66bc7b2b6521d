"""Two gateway replicas' approximate prefix indexes converge through a real Redis stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis

from backends.fleet.approx_sync import APPROX_STREAM, ApproxIndexSync
from backends.publisher import pack_hashes
from routing.index_approx import ApproxPrefixIndex
from routing.prefix import char_block_hashes


async def _until(predicate: object, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.01)
    return False


@asynccontextmanager
async def _two_replicas(redis: aioredis.Redis, **options: Any
                        ) -> AsyncIterator[list[tuple[ApproxPrefixIndex, ApproxIndexSync]]]:
    """Replicas gw-1 and gw-2, caught up and running until the block ends (then cancelled)."""
    replicas, tasks = [], []
    for name in ("gw-1", "gw-2"):
        index = ApproxPrefixIndex(ttl_s=60)
        sync = ApproxIndexSync(redis, index, name, ttl_s=60, **options)
        await sync.catch_up()
        replicas.append((index, sync))
        tasks.append(asyncio.create_task(sync.run()))
    try:
        yield replicas
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with pytest.raises(asyncio.CancelledError):
                await task


async def test_two_replicas_converge_and_a_late_one_catches_up(
        approx_redis: aioredis.Redis) -> None:
    text_a = "system prompt of tenant A " * 20
    text_b = "system prompt of tenant B " * 20
    chain_a = tuple(char_block_hashes(text_a, 64, "m"))
    chain_b = tuple(char_block_hashes(text_b, 64, "m"))
    async with _two_replicas(approx_redis, flush_interval_s=0.02) as replicas:
        (index_1, sync_1), (index_2, sync_2) = replicas
        now_s = time.time()
        index_1.record(chain_a, "w0", now_s)
        sync_1.record(chain_a, "w0", now_s)
        index_2.record(chain_b, "w3", now_s)
        sync_2.record(chain_b, "w3", now_s)
        assert await _until(lambda: index_2.match(chain_a, time.time()).num_blocks.get("w0")
                            == len(chain_a))
        assert await _until(lambda: index_1.match(chain_b, time.time()).num_blocks.get("w3")
                            == len(chain_b))
        late = ApproxPrefixIndex(ttl_s=60)
        await ApproxIndexSync(approx_redis, late, "gw-3", ttl_s=60).catch_up()
        assert late.match(chain_a, time.time()).num_blocks == {"w0": len(chain_a)}
        assert late.match(chain_b, time.time()).num_blocks == {"w3": len(chain_b)}


async def test_expired_claims_are_not_caught_up(approx_redis: aioredis.Redis) -> None:
    chain = tuple(char_block_hashes("x" * 256, 64, "m"))
    writer = ApproxIndexSync(approx_redis, ApproxPrefixIndex(ttl_s=60), "gw-1", ttl_s=60)
    writer.record(chain, "w0", time.time() - 120)  # recorded two minutes ago
    await writer.flush()
    late = ApproxPrefixIndex(ttl_s=60)
    await ApproxIndexSync(approx_redis, late, "gw-2", ttl_s=60).catch_up()
    assert late.match(chain, time.time()).num_blocks == {}


async def test_a_decision_just_sent_is_not_sent_again(approx_redis: aioredis.Redis) -> None:
    """The same prefix to the same backend within republish_s adds no stream entry; another
    backend, another prefix, or the same one later does."""
    chain = tuple(char_block_hashes("a hot system prompt " * 20, 64, "m"))
    other = tuple(char_block_hashes("another prompt entirely " * 20, 64, "m"))
    sync = ApproxIndexSync(approx_redis, ApproxPrefixIndex(ttl_s=60), "gw-1", ttl_s=60,
                           republish_s=0.25)
    now_s = time.time()
    for offset_s in (0.0, 0.1, 0.2):
        sync.record(chain, "w0", now_s + offset_s)
    sync.record(chain, "w1", now_s + 0.2)
    sync.record(other, "w0", now_s + 0.2)
    sync.record(chain, "w0", now_s + 0.3)  # 0.3 s after the first send: sent again
    sync.record((), "w0", now_s)  # a prompt shorter than a block: nothing to share
    await sync.flush()
    entries = await approx_redis.xrange(APPROX_STREAM)
    assert [(e[b"b"], float(e[b"t"]) - now_s) for _, e in entries] == [
        (b"w0", pytest.approx(0.0, abs=1e-3)), (b"w1", pytest.approx(0.2, abs=1e-3)),
        (b"w0", pytest.approx(0.2, abs=1e-3)), (b"w0", pytest.approx(0.3, abs=1e-3))]
    assert sync.num_unsent == 2


async def test_an_entry_added_while_the_catch_up_reply_travelled_is_read(
        approx_redis: aioredis.Redis) -> None:
    """The stream was empty when the catch-up read it; another replica's entry landed, stamped
    by Redis's clock, before the reply reached this replica: the read that follows still gets it."""
    chain = tuple(char_block_hashes("a prompt sent just then " * 10, 64, "m"))
    index = ApproxPrefixIndex(ttl_s=60)
    sync = ApproxIndexSync(approx_redis, index, "gw-1", ttl_s=60, flush_interval_s=0.02)
    await sync.catch_up()  # nothing in the stream
    landed_ms = int(time.time() * 1000) - 50  # 50 ms before this replica's "now"
    await approx_redis.xadd(APPROX_STREAM, {"r": "gw-2", "b": "w5", "t": f"{time.time():.3f}",
                                     "h": pack_hashes(chain)}, id=f"{landed_ms}-0")
    task = asyncio.create_task(sync.run())
    try:
        assert await _until(lambda: index.match(chain, time.time()).num_blocks.get("w5")
                            == len(chain))
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_writer_of_its_own_sends_while_every_read_blocks(
        approx_redis: aioredis.Redis) -> None:
    """With ``push_interval_s``, a decision goes out within that long although both replicas'
    XREADs block for 5 s (nothing else is added)."""
    chain = tuple(char_block_hashes("system prompt of tenant C " * 20, 64, "m"))
    async with _two_replicas(approx_redis, flush_interval_s=5.0,
                             push_interval_s=0.005) as replicas:
        (_, sync_1), (index_2, _) = replicas
        await asyncio.sleep(0.1)  # both XREADs are blocking now
        sync_1.record(chain, "w1", time.time())
        assert await _until(lambda: index_2.match(chain, time.time()).num_blocks.get("w1")
                            == len(chain), timeout_s=1.0)
