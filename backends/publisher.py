"""The worker side of the worker contract: heartbeats and KV-cache events to Redis.

Used by every switchyard worker (the simulated engine and the PyTorch engine), so the gateway
reads one schema (docs/redis.md, "Workers"):

- ``sy:worker:{<id>}``: the heartbeat, a JSON document with a TTL; ``sy:workers``: a sorted
  set of worker ids scored by the last heartbeat (unix ms), for discovery;
- ``sy:kv:{<id>}``: a stream of KV-cache events ``stored`` / ``removed`` / ``cleared``, block
  hashes from ``routing.prefix`` packed as little-endian uint64 in field ``h``;
- ``sy:kvsnap:{<id>}``: every resident block hash and the stream entry id it is current up to,
  so a reader that starts late loads the snapshot and then reads the stream after that id.

Example::

    publisher = KvPublisher(redis, WorkerIdentity("sim-0", "http://127.0.0.1:19001", ...))
    publisher.record("stored", [h1, h2])
    task = asyncio.create_task(publisher.run(load_fn, resident_fn))
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from backends.redis_url import REDIS_ERRORS, pipelined
from routing.prefix import HASH_VERSION

log = logging.getLogger(__name__)

EventType = Literal["stored", "removed", "cleared"]
WORKERS_ZSET = "sy:workers"


def worker_key(worker_id: str) -> str:
    return f"sy:worker:{{{worker_id}}}"


def kv_stream_key(worker_id: str) -> str:
    return f"sy:kv:{{{worker_id}}}"


def kv_snapshot_key(worker_id: str) -> str:
    return f"sy:kvsnap:{{{worker_id}}}"


def pack_hashes(hashes: Iterable[int]) -> bytes:
    values = list(hashes)
    return struct.pack(f"<{len(values)}Q", *values)


def unpack_hashes(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 8}Q", data))


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """What a worker advertises once: who it is and its resource profile."""

    worker_id: str
    url: str
    models: tuple[str, ...]
    profile: Mapping[str, Any] = field(default_factory=dict)


class KvPublisher:
    """Buffers KV events and flushes them with heartbeats and snapshots off the hot path."""

    def __init__(
        self,
        redis: aioredis.Redis,
        identity: WorkerIdentity,
        *,
        heartbeat_interval_s: float = 1.0,
        heartbeat_ttl_s: float = 5.0,
        flush_interval_s: float = 0.05,
        snapshot_interval_s: float = 5.0,
        stream_maxlen: int = 100_000,
    ) -> None:
        self._redis = redis
        self.identity = identity
        self.epoch = f"{int(time.time() * 1000)}-{secrets.token_hex(4)}"
        self._heartbeat_interval_s = heartbeat_interval_s
        self._heartbeat_ttl_ms = int(heartbeat_ttl_s * 1000)
        self._flush_interval_s = flush_interval_s
        self._snapshot_interval_s = snapshot_interval_s
        self._stream_maxlen = stream_maxlen
        self._pending: list[tuple[EventType, list[int]]] = [("cleared", [])]
        self.num_events_published = 0

    def record(self, event: EventType, hashes: list[int]) -> None:
        """Queue one event; cheap, never blocks. Flushed within ``flush_interval_s``."""
        self._pending.append((event, hashes))

    async def run(
        self,
        load: Callable[[], Mapping[str, Any]],
        resident_hashes: Callable[[], Iterable[int]],
    ) -> None:
        """Until cancelled: flush events, heartbeat and snapshot on their intervals."""
        loop = asyncio.get_running_loop()
        next_heartbeat = next_snapshot = loop.time()
        while True:
            is_away = False
            try:
                now = loop.time()
                is_snapshot_due = now >= next_snapshot
                await self.flush(resident_hashes if is_snapshot_due else None)
                if is_snapshot_due:
                    next_snapshot = now + self._snapshot_interval_s
                if now >= next_heartbeat:
                    await self.heartbeat(load())
                    next_heartbeat = now + self._heartbeat_interval_s
            except REDIS_ERRORS as exc:
                log.warning("worker %s cannot reach Redis: %s", self.identity.worker_id, exc)
                is_away = True
            if is_away:  # not in the handler: no await in an except block, compiled
                await asyncio.sleep(min(1.0, self._heartbeat_interval_s))
            await asyncio.sleep(self._flush_interval_s)

    async def flush(self, resident_hashes: Callable[[], Iterable[int]] | None = None) -> None:
        """XADD the pending events; with ``resident_hashes``, also write a snapshot after them."""
        events, self._pending = self._pending, []
        resident = pack_hashes(resident_hashes()) if resident_hashes is not None else None
        worker_id = self.identity.worker_id
        stream = kv_stream_key(worker_id)
        last_id: bytes | str | None = None
        try:
            if events:
                # One transaction, so a gateway blocked in XREAD gets every event in one reply
                # (after each command of a plain pipeline Redis answers it, and it comes back
                # for the rest); a cluster client takes none, and the stream is one slot.
                def add_events(pipe: Any) -> None:
                    for event, hashes in events:
                        pipe.xadd(
                            stream,
                            {"type": event, "h": pack_hashes(hashes), "epoch": self.epoch},
                            maxlen=self._stream_maxlen,
                            approximate=True,
                        )

                ids = await pipelined(self._redis, add_events, transaction=len(events) > 1)
                last_id = ids[-1]
                self.num_events_published += len(events)
        except BaseException:
            self._pending[:0] = events  # keep them for the next flush, in order
            raise
        if resident is not None:
            if last_id is None:
                info = await self._redis.xinfo_stream(stream) if await self._redis.exists(
                    stream) else None
                last_id = info["last-generated-id"] if info else "0-0"
            await self._redis.hset(kv_snapshot_key(worker_id), mapping={
                "epoch": self.epoch, "after_id": last_id, "h": resident,
            })

    async def heartbeat(self, load: Mapping[str, Any]) -> None:
        identity = self.identity
        now_ms = int(time.time() * 1000)
        doc = {
            "id": identity.worker_id,
            "url": identity.url,
            "models": list(identity.models),
            "profile": dict(identity.profile),
            "load": dict(load),
            "epoch": self.epoch,
            "ts_ms": now_ms,
            "ttl_ms": self._heartbeat_ttl_ms,
            "hash_version": HASH_VERSION.decode(),
            "kv_stream": kv_stream_key(identity.worker_id),
            "kv_snapshot": kv_snapshot_key(identity.worker_id),
        }
        def add_beat(pipe: Any) -> None:
            pipe.set(worker_key(identity.worker_id), orjson.dumps(doc), px=self._heartbeat_ttl_ms)
            pipe.zadd(WORKERS_ZSET, {identity.worker_id: now_ms})

        await pipelined(self._redis, add_beat)

    async def withdraw(self) -> None:
        """Leave the fleet at once (clean shutdown); a crash is covered by the heartbeat TTL."""
        worker_id = self.identity.worker_id

        def add_withdrawal(pipe: Any) -> None:
            pipe.delete(worker_key(worker_id))
            pipe.zrem(WORKERS_ZSET, worker_id)
            pipe.xadd(kv_stream_key(worker_id), {"type": "cleared", "h": b"", "epoch": self.epoch},
                      maxlen=self._stream_maxlen, approximate=True)
            pipe.delete(kv_snapshot_key(worker_id))

        with contextlib.suppress(RedisError, OSError):
            await pipelined(self._redis, add_withdrawal)
