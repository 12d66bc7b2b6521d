"""Fleet state, kept current in the background: membership, load and KV residency.

- **Membership.** A switchyard worker that heartbeats into Redis (``sy:workers``,
  ``sy:worker:{id}``) joins the fleet with no restart or configuration change and leaves when
  its heartbeat expires. Backends listed in the configuration always stay (engines switchyard
  did not start); a heartbeat whose URL matches one enriches it instead of duplicating it.
- **Load.** From heartbeats for switchyard workers; for other engines, by scraping their
  ``/metrics`` (vLLM's names, or SGLang's) every ``scrape_interval_s``.
- **KV residency.** Each heartbeat worker's KV-event stream feeds the exact prefix index: the
  snapshot first (``sy:kvsnap:{id}``), then the stream after the snapshot's id.

Example::

    fleet = FleetSync(registry, redis, session, index=ExactPrefixIndex())
    tasks = fleet.start()          # background tasks; cancel them on shutdown
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import aiohttp
import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from backends.publisher import (
    WORKERS_ZSET,
    kv_snapshot_key,
    kv_stream_key,
    unpack_hashes,
    worker_key,
)
from backends.registry import Backend, BackendRegistry
from routing.index_exact import ExactPrefixIndex
from routing.types import BackendProfile

log = logging.getLogger(__name__)

_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")


KvIndex = ExactPrefixIndex

def parse_engine_metrics(text: str) -> dict[str, float]:
    """Running, waiting and KV usage from a vLLM or SGLang ``/metrics`` page, summed."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = line.find("{")
        space = line.rfind(" ")
        name = line[: name_end if name_end != -1 else space]
        for key, names in (("running", _RUNNING), ("waiting", _WAITING), ("kv", _KV_USAGE)):
            if name in names:
                with contextlib.suppress(ValueError):
                    totals[key] = totals.get(key, 0.0) + float(line[space + 1:])
    return totals


def profile_from_heartbeat(doc: dict[str, Any]) -> BackendProfile:
    profile = doc.get("profile") or {}
    def number(key: str) -> Any:
        value = profile.get(key)
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    return BackendProfile(
        device=str(profile.get("device", "unknown")),
        num_kv_blocks=number("num_kv_blocks"),
        block_size=number("block_size"),
        max_batch=number("max_batch"),
        max_context_tokens=number("max_context_tokens"),
        prefill_tokens_per_s=number("prefill_tokens_per_s"),
    )


class FleetSync:
    def __init__(
        self,
        registry: BackendRegistry,
        redis: aioredis.Redis,
        session: aiohttp.ClientSession,
        *,
        index: KvIndex | None = None,
        poll_interval_s: float = 0.25,
        scrape_interval_s: float = 1.0,
        on_change: Any = None,
    ) -> None:
        self._registry = registry
        self._redis = redis
        self._session = session
        self._index = index
        self._poll_interval_s = poll_interval_s
        self._scrape_interval_s = scrape_interval_s
        self._on_change = on_change
        self._stream_ids: dict[str, bytes] = {}  # backend name -> last KV stream id applied
        self._epochs: dict[str, str] = {}  # backend name -> its worker's current epoch
        self._worker_ids: dict[str, str] = {}  # backend name -> worker id (names its streams)
        self._load_ts_ms: dict[str, float] = {}  # backend name -> when its load figures were made
        self._streams_changed = asyncio.Event()

    def start(self) -> list[asyncio.Task[None]]:
        return [
            asyncio.create_task(self._forever(self.poll_members, self._poll_interval_s),
                                name="fleet-members"),
            asyncio.create_task(self._forever(self.scrape_metrics, self._scrape_interval_s),
                                name="fleet-metrics"),
            asyncio.create_task(self.consume_kv_events(), name="fleet-kv-events"),
        ]

    async def _forever(self, step: Any, interval_s: float) -> None:
        while True:
            try:
                await step()
            except (RedisError, OSError) as exc:
                log.warning("fleet sync: %s", exc)
            await asyncio.sleep(interval_s)

    # -- membership and heartbeat load --------------------------------------------------
    async def poll_members_once(self) -> None:
        """One membership poll that never fails start-up (Redis may be down)."""
        try:
            await self.poll_members()
        except (RedisError, OSError) as exc:
            log.warning("fleet sync: cannot read workers from Redis yet: %s", exc)

    async def poll_members(self) -> None:
        now_ms = time.time() * 1000
        members: Any = await self._redis.zrangebyscore(WORKERS_ZSET, now_ms - 60_000, "+inf")
        ids = [i.decode() for i in members]
        docs = await self._redis.mget([worker_key(i) for i in ids]) if ids else []
        alive: set[str] = set()
        for raw in docs:
            if raw is None:
                continue  # expired: the worker stopped beating
            doc = orjson.loads(raw)
            age_s = max(0.0, (now_ms - float(doc["ts_ms"])) / 1000)
            if age_s * 1000 > float(doc.get("ttl_ms", 5000)):
                continue
            alive.add(self._upsert(doc, age_s))
        for backend in list(self._registry.backends):
            if backend.source == "heartbeat" and backend.name not in alive:
                log.info("worker %s left the fleet (heartbeat expired)", backend.name)
                self._registry.remove(backend.name)
                self._forget(backend.name)

    def _upsert(self, doc: dict[str, Any], age_s: float) -> str:
        url = str(doc["url"]).rstrip("/")
        backend = self._registry.get(str(doc["id"])) or next(
            (b for b in self._registry.backends if b.url == url), None)
        if backend is None:
            backend = Backend(name=str(doc["id"]), url=url, models=frozenset(doc["models"]),
                              source="heartbeat")
            self._registry.add(backend)
            log.info("worker %s joined the fleet at %s", backend.name, url)
            self._streams_changed.set()
        if self._epochs.get(backend.name) not in (None, doc.get("epoch")):
            self._forget(backend.name)  # restarted: its cache is empty, reload from snapshot
            self._streams_changed.set()
        self._epochs[backend.name] = str(doc.get("epoch"))
        self._worker_ids[backend.name] = str(doc["id"])
        backend.profile = profile_from_heartbeat(doc)
        load = doc.get("load") or {}
        backend.num_running = int(load.get("num_running", 0))
        backend.num_waiting = int(load.get("num_waiting", 0))
        backend.kv_usage = float(load.get("kv_usage", 0.0))
        backend.num_queued_prefill_tokens = int(load.get("num_queued_prefill_tokens", 0))
        prefix_blocks = load.get("num_prefix_kv_blocks")  # absent from older workers
        backend.num_prefix_kv_blocks = (int(prefix_blocks) if isinstance(prefix_blocks, int | float)
                                        and not isinstance(prefix_blocks, bool) else None)
        backend.load_observed_s = time.monotonic() - age_s
        # A poll that reads the same heartbeat again keeps the finishes seen since it was read
        # (the engine's figures still count those requests); a new heartbeat starts afresh.
        ts_ms = float(doc["ts_ms"])
        if self._load_ts_ms.get(backend.name) != ts_ms:
            self._load_ts_ms[backend.name] = ts_ms
            backend.num_finished_since_load = 0
        if backend.source == "heartbeat":
            backend.is_healthy = True
        return backend.name

    def _forget(self, name: str) -> None:
        self._stream_ids.pop(name, None)
        self._load_ts_ms.pop(name, None)
        self._epochs.pop(name, None)
        self._worker_ids.pop(name, None)
        if self._index is not None:
            self._index.remove_backend(name)

    # -- engines switchyard did not start: scrape /metrics ------------------------------
    async def scrape_metrics(self) -> None:
        targets = [b for b in self._registry.backends
                   if b.source == "config" and b.name not in self._epochs]
        await asyncio.gather(*(self._scrape(b) for b in targets))

    async def _scrape(self, backend: Backend) -> None:
        try:
            async with self._session.get(backend.url + "/metrics",
                                         timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                if resp.status != 200:
                    return
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return
        totals = parse_engine_metrics(text)
        if not totals:
            return
        backend.num_running = int(totals.get("running", 0))
        backend.num_waiting = int(totals.get("waiting", 0))
        backend.kv_usage = min(1.0, max(0.0, totals.get("kv", 0.0)))
        backend.load_observed_s = time.monotonic()
        backend.num_finished_since_load = 0

    # -- KV events into the exact index --------------------------------------------------
    async def consume_kv_events(self) -> None:
        while True:
            try:
                await self._consume_once()
            except (RedisError, OSError) as exc:
                log.warning("fleet KV events: %s", exc)
                await asyncio.sleep(1.0)

    async def _consume_once(self) -> None:
        if self._index is None:
            await asyncio.sleep(3600)
            return
        workers = [b.name for b in self._registry.backends if b.name in self._epochs]
        for name in workers:
            if name not in self._stream_ids:
                await self._load_snapshot(name)
        names_by_stream = {kv_stream_key(self._worker_ids[n]): n for n in workers
                           if n in self._stream_ids and n in self._worker_ids}
        streams: dict[Any, Any] = {key: self._stream_ids[n] for key, n in names_by_stream.items()}
        if not streams:
            self._streams_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._streams_changed.wait(), self._poll_interval_s)
            return
        replies: Any = await self._redis.xread(dict(streams), count=1000, block=200)
        for stream, entries in replies or []:
            owner = names_by_stream.get(stream.decode() if isinstance(stream, bytes) else stream)
            if owner is None or owner not in self._stream_ids:
                continue
            for entry_id, fields in entries:
                kind = fields[b"type"].decode()
                if kind in ("stored", "removed", "cleared"):
                    self._index.apply(owner, kind, unpack_hashes(fields[b"h"]))
                self._stream_ids[owner] = entry_id

    async def _load_snapshot(self, name: str) -> None:
        assert self._index is not None
        snapshot: Any = await self._redis.hgetall(kv_snapshot_key(self._worker_ids[name]))
        self._index.apply(name, "cleared", [])
        if snapshot:
            self._index.load_snapshot(name, unpack_hashes(snapshot[b"h"]))
            self._stream_ids[name] = snapshot[b"after_id"]
        else:
            self._stream_ids[name] = b"0-0"

