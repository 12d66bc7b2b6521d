"""Fleet state, kept current in the background: membership, load and KV residency.

- **Membership.** A switchyard worker that heartbeats into Redis (``sy:workers``,
  ``sy:worker:{id}``) joins the fleet with no restart or configuration change and leaves when
  its heartbeat expires. Backends listed in the configuration always stay (engines switchyard
  did not start); a heartbeat whose URL matches one enriches it instead of duplicating it.
- **Load.** From heartbeats for switchyard workers; for other engines, by scraping their
  ``/metrics`` (vLLM's names, or SGLang's) every ``scrape_interval_s``. With ``scrapes`` (a
  ``backends.fleet.scrape_share.ScrapeShare``) the replicas share those scrapes: an engine
  whose figures another replica read within the interval is not scraped here.
- **KV residency.** Each heartbeat worker's KV-event stream feeds the exact prefix index: the
  snapshot first (``sy:kvsnap:{id}``), then the stream after the snapshot's id. On one Redis a
  single blocking ``XREAD`` follows every stream; on a Redis Cluster, where each worker's stream
  sits in its own hash slot, one pipelined non-blocking ``XREAD`` per stream is sent every
  ``CLUSTER_KV_POLL_S`` (the cluster client sends each node its share at once): 20 reads a
  second per worker per gateway replica, and up to 50 ms more before an event is seen. On a plain
  Redis the blocking read goes over a connection of its own with RESP written by hand
  (``backends.resp``: a few times less CPU per read than redis-py, and every replica reads every
  worker's events). An entry this version cannot read is counted (``num_malformed_kv``) and
  skipped.

Without Redis (``redis=None``: a single gateway keeping its state in memory) only the listed
engines are followed, by scraping and profile discovery; Redis is never touched.

Example::

    fleet = FleetSync(registry, redis, session, index=ExactPrefixIndex())
    tasks = fleet.start()          # background tasks; cancel them on shutdown
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import redis.asyncio as aioredis

from backends.fleet.profiles import (
    INFERRED_SOURCE,
    ProfileFacts,
    SaturationWatch,
    facts,
    heartbeat_facts,
    merge,
    parse_llamacpp_props,
    parse_openai_models,
    parse_sglang_server_info,
    parse_vllm_cache_config,
)
from backends.fleet.prom import metric_sums
from backends.fleet.registry import Backend, BackendRegistry
from backends.fleet.scrape_share import HeardFigures, ScrapeShare
from backends.publisher import (
    WORKERS_ZSET,
    kv_snapshot_key,
    kv_stream_key,
    unpack_hashes,
    worker_key,
)
from backends.redis_url import REDIS_ERRORS, is_cluster, raise_if_cancelled
from backends.resp import RESP_TIMEOUT_S, RespAddress, RespConnection
from routing.index_exact import ExactPrefixIndex
from routing.types import BackendProfile

log = logging.getLogger(__name__)
_UNREACHABLE = object()  # a page fetch that got no answer at all
_MAX_PAGE_BYTES = 4 << 20

# vLLM, SGLang, llama.cpp (llama-server --metrics) and TGI names for the same three figures.
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs",
            "llamacpp:requests_processing", "tgi_batch_current_size")
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred",
            "tgi_queue_size")
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
             "llamacpp:kv_cache_usage_ratio")
# Pages that state an engine's profile, each with its parser (backends.fleet.profiles).
_PROFILE_PAGES: tuple[tuple[str, Callable[[Any], ProfileFacts]], ...] = (
    ("/v1/models", parse_openai_models),
    ("/get_server_info", parse_sglang_server_info),
    ("/props", parse_llamacpp_props),
)


KvIndex = ExactPrefixIndex
RESTART_GRACE_S = 5.0  # a heartbeat's TTL: every live worker has beaten again by then
CLUSTER_KV_POLL_S = 0.05  # on a Redis Cluster, the pause between polls of the KV streams
KV_READ_COUNT = 1000  # entries read from a stream at a time
KV_BLOCK_MS = 200  # a blocking read of the KV streams returns empty after this long
SCRAPE_INTERVAL_S = 1.0  # each listed engine's /metrics is read this often
SCRAPE_JITTER = 0.05  # with shared scrapes: each wait is the interval +- this share of it

def parse_engine_metrics(text: str) -> dict[str, float]:
    """Running, waiting and KV usage from a vLLM or SGLang ``/metrics`` page, summed; a figure
    the page does not have is left out."""
    return metric_sums(text, {"running": _RUNNING, "waiting": _WAITING, "kv": _KV_USAGE})


def profile_from_heartbeat(doc: dict[str, Any]) -> BackendProfile:
    """The profile a heartbeat advertises, alone (``Backend.learn_profile`` merges it)."""
    profile = doc.get("profile")
    return merge([heartbeat_facts(profile if isinstance(profile, dict) else {})])[0]


class FleetSync:
    def __init__(
        self,
        registry: BackendRegistry,
        redis: aioredis.Redis | None,
        session: aiohttp.ClientSession,
        *,
        index: KvIndex | None = None,
        poll_interval_s: float = 0.25,
        scrape_interval_s: float = SCRAPE_INTERVAL_S,
        discover_interval_s: float = 30.0,
        discover_workers: bool = True,
        on_change: Any = None,
        is_plain_resp: bool = True,
        scrapes: ScrapeShare | None = None,
    ) -> None:
        self._scrapes = scrapes
        if scrapes is not None:
            scrapes.on_figures = self.hear_figures
        # Listed engines this replica has scraped itself, by name: each once at least, for the
        # cache configuration its page carries and the shared figures do not (a reload that
        # changes an engine's URL or models makes it a new Backend, scraped afresh).
        self._scraped_here: dict[str, Backend] = {}
        self._is_plain_resp = is_plain_resp  # the KV read on a connection of its own
        self._discover_interval_s = discover_interval_s
        self._discover_workers = discover_workers and redis is not None
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
        self._saturation = SaturationWatch()  # max batch of engines that do not say it
        self._streams_changed = asyncio.Event()
        # Redis's run id, and until when (monotonic) heartbeat workers missing from it are kept
        # because Redis restarted empty: they beat again within their interval.
        self._redis_run_id: str | None = None
        self._restart_grace_until_s = 0.0
        self.num_malformed_kv = 0  # KV-event entries that were not events this version reads
        self.num_scrapes_read = 0  # listed engines' /metrics pages fetched by this replica

    async def first_look(self) -> None:
        """One scrape and one profile discovery of the listed engines, never failing."""
        with contextlib.suppress(OSError, aiohttp.ClientError):
            await self.scrape_metrics()
            await self.discover_profiles()

    def start(self) -> list[asyncio.Task[None]]:
        members = ([asyncio.create_task(self._forever(self.poll_members, self._poll_interval_s),
                                        name="fleet-members")] if self._discover_workers else [])
        kv_events = ([asyncio.create_task(self.consume_kv_events(), name="fleet-kv-events")]
                     if self._redis is not None else [])
        return [
            *members,
            asyncio.create_task(self._scrape_forever(), name="fleet-metrics"),
            asyncio.create_task(self._forever(self.discover_profiles, self._discover_interval_s),
                                name="fleet-profiles"),
            *kv_events,
        ]

    async def _scrape_forever(self) -> None:
        """The scrape loop. With shared scrapes it starts at a random point of the interval
        and each wait is the interval ± ``SCRAPE_JITTER``: replicas started together
        (``serve --workers N``) would otherwise tick together for good, each scraping before
        the others' figures arrive."""
        interval_s = self._scrape_interval_s
        if self._scrapes is None:
            await self._forever(self.scrape_metrics, interval_s)
            return
        await asyncio.sleep(random.uniform(0.0, interval_s))
        await self._forever(self.scrape_metrics, interval_s, jitter=SCRAPE_JITTER)

    async def _forever(self, step: Any, interval_s: float, *, jitter: float = 0.0) -> None:
        while True:
            raise_if_cancelled()
            try:
                await step()
            except REDIS_ERRORS as exc:
                log.warning("fleet sync: %s", exc)
            await asyncio.sleep(interval_s * (1.0 + random.uniform(-jitter, jitter)))

    # -- membership and heartbeat load --------------------------------------------------
    async def poll_members_once(self) -> None:
        """One membership poll that never fails start-up (Redis may be down)."""
        try:
            await self.poll_members()
        except REDIS_ERRORS as exc:
            log.warning("fleet sync: cannot read workers from Redis yet: %s", exc)

    async def poll_members(self) -> None:
        redis = self._redis
        if redis is None:
            return  # no Redis: no heartbeating workers to find
        if self._redis_run_id is None:
            self._redis_run_id = await self._run_id()
        now_ms = time.time() * 1000
        members: Any = await redis.zrangebyscore(WORKERS_ZSET, now_ms - 60_000, "+inf")
        ids = [i.decode() for i in members]
        keys = [worker_key(i) for i in ids]
        # Each heartbeat is in its own hash slot: a cluster takes one MGET per slot.
        docs: Any = (await redis.mget_nonatomic(keys) if is_cluster(redis)  # type: ignore[attr-defined]
                     else await redis.mget(keys)) if ids else []
        alive: set[str] = set()
        for raw in docs:
            if raw is None:
                continue  # expired: the worker stopped beating
            doc = orjson.loads(raw)
            age_s = max(0.0, (now_ms - float(doc["ts_ms"])) / 1000)
            if age_s * 1000 > float(doc.get("ttl_ms", 5000)):
                continue
            alive.add(self._upsert(doc, age_s))
        missing = [b for b in self._registry.backends
                   if b.source == "heartbeat" and b.name not in alive]
        if missing and await self._redis_restarted():
            return  # its keys are gone, not its workers: keep them while they beat again
        for backend in missing:
            log.info("worker %s left the fleet (heartbeat expired)", backend.name)
            self._registry.remove(backend.name)
            self._forget(backend.name)

    async def _redis_restarted(self) -> bool:
        """Whether Redis restarted (a new run id) within the last heartbeat TTL: then every
        worker's heartbeat is missing at once, though each will beat again within its interval
        (removing them answered 404 model_not_found until then)."""
        run_id = await self._run_id()
        now_s = time.monotonic()
        if self._redis_run_id is not None and run_id != self._redis_run_id:
            log.warning("fleet sync: Redis restarted; keeping its %d heartbeat workers for %.0f "
                        "s while they beat again", len(self._registry.backends),
                        RESTART_GRACE_S)
            self._restart_grace_until_s = now_s + RESTART_GRACE_S
        self._redis_run_id = run_id
        return now_s < self._restart_grace_until_s

    async def _run_id(self) -> str:
        """The Redis server's run id; on a cluster, the node that holds ``sy:workers`` (the
        heartbeats that vanish at once when it restarts empty are spread over every node, but
        the set that lists them is there)."""
        assert self._redis is not None
        if is_cluster(self._redis):
            node = self._redis.get_node_from_key(WORKERS_ZSET)  # type: ignore[attr-defined]
            info: Any = await self._redis.info("server", target_nodes=node)
        else:
            info = await self._redis.info("server")
        return str(info.get("run_id", ""))

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
        profile = doc.get("profile")
        backend.learn_profile(heartbeat_facts(profile if isinstance(profile, dict) else {}))
        backend.load_source = "heartbeat"
        load = doc.get("load") or {}
        backend.num_running = int(load.get("num_running", 0))
        backend.num_waiting = int(load.get("num_waiting", 0))
        backend.kv_usage = float(load.get("kv_usage", 0.0))
        backend.num_queued_prefill_tokens = int(load.get("num_queued_prefill_tokens", 0))
        prefix_blocks = load.get("num_prefix_kv_blocks")  # absent from older workers
        backend.num_prefix_kv_blocks = (int(prefix_blocks) if isinstance(prefix_blocks, int | float)
                                        and not isinstance(prefix_blocks, bool) else None)
        # A poll that reads the same heartbeat again keeps the finishes seen since it was read
        # (the engine's figures still count those requests); a new heartbeat starts afresh.
        ts_ms = float(doc["ts_ms"])
        is_new = self._load_ts_ms.get(backend.name) != ts_ms
        self._load_ts_ms[backend.name] = ts_ms
        backend.load_observed(time.monotonic() - age_s, is_new=is_new)
        if backend.source == "heartbeat" and is_new:
            # A new heartbeat: the worker is alive. The same one read again proves nothing: a
            # worker that failed a request since stays out until it beats again.
            backend.is_healthy = True
            backend.invalidate()
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
        await asyncio.gather(*(self._scrape(b) for b in self.scrape_round()))
        if self._scrapes is not None:
            self._scrapes.queued()

    def scrape_round(self) -> list[Backend]:
        """The listed engines to scrape this round: all of them, or with shared scrapes
        those whose figures, read here or heard, are old (and each once at least)."""
        scrapes = self._scrapes
        return [b for b in self._registry.backends
                if b.source == "config" and b.name not in self._epochs
                and (scrapes is None or self._scraped_here.get(b.name) is not b
                     or scrapes.is_due(b.name))]

    async def _scrape(self, backend: Backend) -> None:
        self.num_scrapes_read += 1
        text = await self._get(backend, "/metrics", as_json=False)
        if text is _UNREACHABLE:
            return  # load unknown: the figures age and routing treats it as stale
        totals = parse_engine_metrics(text) if isinstance(text, str) else {}
        if isinstance(text, str) and backend.discover_profile:
            cache_config = parse_vllm_cache_config(text)
            if cache_config.values:
                backend.learn_profile(cache_config)
        figures: HeardFigures = None
        if totals:
            figures = (int(totals.get("running", 0)), int(totals.get("waiting", 0)),
                       min(1.0, max(0.0, totals.get("kv", 0.0))))
        self._take_figures(backend, figures, time.monotonic())
        self._scraped_here[backend.name] = backend
        if self._scrapes is not None:
            self._scrapes.scraped(backend.name, figures)

    def hear_figures(self, name: str, figures: HeardFigures, heard_s: float) -> None:
        """Another replica's scrape of ``name`` (``ScrapeShare.on_figures``), taken as this
        replica's own, as of ``heard_s`` (monotonic); ignored for an engine this replica does
        not list, or hears from by heartbeat."""
        backend = self._registry.get(name)
        if backend is None or backend.source != "config" or name in self._epochs:
            return
        self._take_figures(backend, figures, heard_s)

    def _take_figures(self, backend: Backend, figures: HeardFigures, observed_s: float) -> None:
        if figures is None:
            # It answers but exposes no load figures (llama.cpp without --metrics, TGI's
            # other names, any OpenAI-compatible server): the gateway's books are its load.
            if backend.load_source != "books":
                log.info("backend %s exposes no load metrics on /metrics: its load is what "
                         "this gateway sent it", backend.name)
            backend.load_source = "books"
            backend.invalidate()
            return
        backend.load_source = "metrics"
        backend.num_running, backend.num_waiting, backend.kv_usage = figures
        backend.load_observed(observed_s)
        if backend.discover_profile:
            inferred = self._saturation.observe(backend.name, backend.num_running,
                                                backend.num_waiting)
            if inferred is not None:
                backend.learn_profile(facts(INFERRED_SOURCE, max_batch=inferred))

    # -- profiles of engines switchyard did not start -----------------------------------
    async def discover_profiles(self) -> None:
        """Read each listed engine's profile pages (the fields the configuration leaves out)."""
        targets = [b for b in self._registry.backends if b.source == "config"
                   and b.discover_profile and b.name not in self._epochs and b.is_healthy]
        await asyncio.gather(*(self.discover_profile(b) for b in targets))

    async def discover_profile(self, backend: Backend) -> None:
        for path, parse in _PROFILE_PAGES:
            doc = await self._get(backend, path, as_json=True)
            if doc is _UNREACHABLE:
                return
            if doc is not None:
                learned = parse(doc)
                if learned.values:
                    backend.learn_profile(learned)

    async def _get(self, backend: Backend, path: str, *, as_json: bool) -> Any:
        """The page's text (or JSON), None when the engine answers without it, or
        ``_UNREACHABLE`` when it does not answer."""
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else None
        try:
            async with self._session.get(backend.url + path, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                if resp.status != 200:
                    return None
                raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return _UNREACHABLE
        if len(raw) > _MAX_PAGE_BYTES:
            return None
        if not as_json:
            return raw.decode("utf-8", "replace")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None

    # -- KV events into the exact index --------------------------------------------------
    async def consume_kv_events(self) -> None:
        if self._redis is None:
            return  # no Redis: no KV-event streams
        address = (RespAddress.of(self._redis)
                   if self._is_plain_resp and not is_cluster(self._redis) else None)
        conn = None if address is None else RespConnection(address, timeout_s=RESP_TIMEOUT_S)
        try:
            while True:
                raise_if_cancelled()
                try:
                    await self._consume_once(conn)
                except REDIS_ERRORS as exc:
                    raise_if_cancelled()
                    log.warning("fleet KV events: %s", exc)
                    await asyncio.sleep(1.0)
        finally:
            if conn is not None:
                await conn.aclose()

    async def _consume_once(self, conn: RespConnection | None = None) -> None:
        redis = self._redis
        if self._index is None or redis is None:
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
        replies: Any
        if is_cluster(redis):
            replies = await self._xread_each(redis, streams)
        elif conn is not None:
            replies = await conn.xread(streams, count=KV_READ_COUNT, block_ms=KV_BLOCK_MS)
        else:
            replies = await redis.xread(dict(streams), count=KV_READ_COUNT, block=KV_BLOCK_MS)
        for stream, entries in replies or []:
            owner = names_by_stream.get(stream.decode() if isinstance(stream, bytes) else stream)
            if owner is None or owner not in self._stream_ids:
                continue
            for entry_id, fields in entries:
                try:
                    kind = fields[b"type"].decode()
                    hashes = (unpack_hashes(fields[b"h"])
                              if kind in ("stored", "removed", "cleared") else None)
                except (KeyError, AttributeError, TypeError, UnicodeDecodeError, struct.error):
                    self.num_malformed_kv += 1  # not an event this version can read: skipped
                else:
                    if hashes is not None:
                        self._index.apply(owner, kind, hashes)
                self._stream_ids[owner] = entry_id

    @staticmethod
    async def _xread_each(redis: aioredis.Redis, streams: dict[Any, Any]) -> list[Any]:
        """``XREAD`` of each stream on its own (a cluster refuses one over several slots),
        pipelined; then a pause of ``CLUSTER_KV_POLL_S``, unless a stream filled its reply
        (more is waiting), so a busy fleet costs one poll per pause, not a busy loop."""
        async with redis.pipeline(transaction=False) as pipe:
            for key, after in streams.items():
                pipe.xread({key: after}, count=KV_READ_COUNT)
            found = [reply for replies in await pipe.execute() for reply in replies or []]
        if all(len(entries) < KV_READ_COUNT for _, entries in found):
            await asyncio.sleep(CLUSTER_KV_POLL_S)
        return found

    async def _load_snapshot(self, name: str) -> None:
        assert self._index is not None and self._redis is not None
        snapshot: Any = await self._redis.hgetall(kv_snapshot_key(self._worker_ids[name]))
        self._index.apply(name, "cleared", [])
        if snapshot:
            self._index.load_snapshot(name, unpack_hashes(snapshot[b"h"]))
            self._stream_ids[name] = snapshot[b"after_id"]
        else:
            self._stream_ids[name] = b"0-0"

