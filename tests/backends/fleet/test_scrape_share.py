"""Gateway replicas share their /metrics scrapes of listed engines: in process, and through a
real Redis stream and real engines on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import orjson
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from backends.fleet.approx_sync import APPROX_STREAM, ApproxIndexSync, lesson_of
from backends.fleet.peer_load import PeerLoad, load_of
from backends.fleet.registry import Backend, BackendRegistry
from backends.fleet.scrape_share import SCRAPE_FIELD, ScrapeShare
from backends.fleet.sync import FleetSync
from routing.index_approx import ApproxPrefixIndex


def test_figures_go_out_once_and_come_back_as_sent() -> None:
    sender, reader = ScrapeShare("gw-1", fresh_s=0.9), ScrapeShare("gw-2", fresh_s=0.9)
    heard: list[tuple[str, object, float]] = []
    reader.on_figures = lambda name, figures, at_s: heard.append((name, figures, at_s))
    assert sender.entry() is None  # nothing read: nothing to send
    sender.scraped("a", (3, 1, 0.25), now_s=1.0)
    sender.scraped("b", None, now_s=1.0)  # answers with no load figures
    fields = sender.entry()
    assert fields is not None and sender.entry() is None  # taken
    # Read by an earlier version as a claim on nothing (no backend, no hashes), and by this
    # one as neither a lesson nor a replica's counts.
    assert fields["b"] == "" and fields["h"] == b"" and float(fields["t"]) > 0
    assert lesson_of(fields) is None and load_of(fields) is None
    payload = fields[SCRAPE_FIELD.decode()]
    assert orjson.loads(payload) == {"a": [3, 1, 0.25], "b": None}
    reader.merge(b"gw-1", payload, now_s=5.0)
    assert heard == [("a", (3, 1, 0.25), 5.0), ("b", None, 5.0)]
    assert reader.num_heard == 2
    sender.merge("gw-1", payload, now_s=5.0)  # its own entry: nothing new
    assert sender.num_heard == 0


def test_an_engine_is_due_when_nobodys_figures_are_fresh() -> None:
    share = ScrapeShare("gw-1", fresh_s=0.9)
    assert share.is_due("a", now_s=0.0)  # never read or heard
    share.scraped("a", (0, 0, 0.0), now_s=10.0)
    assert not share.is_due("a", now_s=10.5)
    assert share.is_due("a", now_s=10.9)
    share.merge("gw-2", orjson.dumps({"a": [1, 0, 0.1]}), now_s=11.0)  # heard: fresh again
    assert not share.is_due("a", now_s=11.5) and share.is_due("a", now_s=11.95)


@pytest.mark.parametrize("payload", [
    b"not json", b"[1, 2]", orjson.dumps({"a": [1, 2]}), orjson.dumps({"a": [-1, 0, 0.1]}),
    orjson.dumps({"a": [1, 0, 1.5]}), orjson.dumps({"a": ["x", 0, 0.1]}),
    orjson.dumps({"a": {"running": 1}}), orjson.dumps({"ok": [1, 0, 0.1], "bad": [1]}),
])
def test_a_malformed_entry_is_counted_and_changes_nothing(payload: bytes) -> None:
    share = ScrapeShare("gw-1", fresh_s=0.9)
    heard: list[str] = []
    share.on_figures = lambda name, figures, at_s: heard.append(name)
    share.merge("gw-2", payload, now_s=1.0)
    assert share.num_malformed == 1 and heard == [] and share.is_due("ok", now_s=1.0)


# -- through Redis, with real engines ---------------------------------------------------------
@dataclass
class _Engine:
    """A listed engine on loopback: a /metrics page in vLLM's names, its GETs counted."""

    running: int = 2
    waiting: int = 1
    scrapes: list[float] = field(default_factory=list)

    async def metrics(self, request: web.Request) -> web.Response:
        self.scrapes.append(time.monotonic())
        return web.Response(text=(
            f'vllm:num_requests_running{{model_name="m"}} {self.running}\n'
            f'vllm:num_requests_waiting{{model_name="m"}} {self.waiting}\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'))


@contextlib.asynccontextmanager
async def _engine() -> AsyncIterator[tuple[_Engine, str]]:
    engine = _Engine()
    app = web.Application()
    app.router.add_get("/metrics", engine.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield engine, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@dataclass
class _Replica:
    registry: BackendRegistry
    fleet: FleetSync
    tasks: list[asyncio.Task[None]]

    @property
    def backend(self) -> Backend:
        backend = self.registry.get("vllm-0")
        assert backend is not None
        return backend

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _replica(redis: aioredis.Redis, session: aiohttp.ClientSession, url: str, name: str,
                   *, interval_s: float, is_shared: bool) -> _Replica:
    registry = BackendRegistry([Backend(name="vllm-0", url=url, models=frozenset({"m"}),
                                        discover_profile=False)])
    scrapes = ScrapeShare(name, fresh_s=0.9 * interval_s) if is_shared else None
    sync = ApproxIndexSync(redis, ApproxPrefixIndex(ttl_s=60), name, ttl_s=60,
                           flush_interval_s=0.05, peers=PeerLoad(registry, name),
                           scrapes=scrapes)
    fleet = FleetSync(registry, redis, session, scrape_interval_s=interval_s,
                      discover_workers=False, scrapes=scrapes)
    await sync.catch_up()
    await fleet.first_look()
    tasks = [asyncio.create_task(sync.run()), *fleet.start()]
    return _Replica(registry, fleet, tasks)


async def _scrapes_over(engine: _Engine, window_s: float) -> int:
    """The scrapes ``engine`` answers over ``window_s``, once the replicas' first looks are
    done."""
    await asyncio.sleep(0.1)
    started = len(engine.scrapes)
    await asyncio.sleep(window_s)
    return len(engine.scrapes) - started


async def test_replicas_scrape_an_engine_about_once_an_interval_and_take_over(
        approx_redis: aioredis.Redis) -> None:
    interval_s = 0.2
    async with _engine() as (engine, url), aiohttp.ClientSession() as session:
        replicas = [await _replica(approx_redis, session, url, f"gw-{i}",
                                   interval_s=interval_s, is_shared=True) for i in range(3)]
        try:
            in_window = await _scrapes_over(engine, 10 * interval_s)
            # Three replicas alone would scrape 30 times in 10 intervals; shared, about 10
            # (a tick that falls within a round trip of another's adds one).
            assert 8 <= in_window <= 18, in_window
            engine.running, engine.waiting = 7, 4
            await asyncio.sleep(3 * interval_s)
            # Every replica routes on the engine's latest figures, read here or heard.
            for replica in replicas:
                assert replica.backend.load_source == "metrics"
                assert (replica.backend.num_running, replica.backend.num_waiting) == (7, 4)
            entries = await approx_redis.xrange(APPROX_STREAM)
            assert any(SCRAPE_FIELD in fields for _, fields in entries)
            # The replicas that scrape stop; the last one scrapes the engine itself from the
            # next tick at which the figures are old, and they stay current.
            for replica in replicas[:2]:
                await replica.stop()
            await asyncio.sleep(2 * interval_s)
            before = len(engine.scrapes)
            engine.running = 9
            await asyncio.sleep(5 * interval_s)
            assert len(engine.scrapes) - before >= 4
            backend = replicas[2].backend
            assert backend.num_running == 9
            assert backend.load_observed_s is not None
            assert time.monotonic() - backend.load_observed_s < 2 * interval_s
        finally:
            for replica in replicas:
                await replica.stop()


async def test_without_sharing_each_replica_scrapes_the_engine_itself(
        approx_redis: aioredis.Redis) -> None:
    interval_s = 0.2
    async with _engine() as (engine, url), aiohttp.ClientSession() as session:
        replicas = [await _replica(approx_redis, session, url, f"gw-{i}",
                                   interval_s=interval_s, is_shared=False) for i in range(3)]
        try:
            assert await _scrapes_over(engine, 10 * interval_s) >= 24
            entries = await approx_redis.xrange(APPROX_STREAM)
            assert not any(SCRAPE_FIELD in fields for _, fields in entries)
        finally:
            for replica in replicas:
                await replica.stop()


async def test_heard_figures_load_a_listed_engine_and_nothing_else() -> None:
    """``FleetSync.hear_figures``: another replica's figures for a listed engine are taken as
    this replica's own scrape (the books since start afresh); for an engine it does not list,
    or one that joined by heartbeat, they are ignored; ``null`` means its books are its load."""
    listed = Backend(name="vllm-0", url="http://127.0.0.1:9", models=frozenset({"m"}))
    joined = Backend(name="w-1", url="http://127.0.0.1:10", models=frozenset({"m"}),
                     source="heartbeat")
    registry = BackendRegistry([listed, joined])
    scrapes = ScrapeShare("gw-1", fresh_s=0.9)
    async with aiohttp.ClientSession() as session:
        FleetSync(registry, None, session, discover_workers=False, scrapes=scrapes)
        listed.book_started(reserved_tokens=10, pending_prefill_tokens=5)
        listed.book_finished(10, 5, had_first_token=False, was_ending=False)
        assert listed.num_finished_since_load == 1
        scrapes.merge("gw-2", orjson.dumps({"vllm-0": [5, 2, 0.3], "w-1": [9, 9, 0.9],
                                            "elsewhere": [1, 0, 0.0]}), now_s=100.0)
        assert (listed.load_source, listed.num_running, listed.num_waiting,
                listed.kv_usage, listed.load_observed_s) == ("metrics", 5, 2, 0.3, 100.0)
        assert listed.num_finished_since_load == 0
        assert joined.load_source is None and joined.num_running == 0
        scrapes.merge("gw-2", orjson.dumps({"vllm-0": None}), now_s=101.0)
        assert listed.load_source == "books"


async def test_a_replica_scrapes_each_engine_itself_once_then_only_when_due() -> None:
    """Fresh figures heard from another replica spare the scrape, but not the first one (the
    page's cache configuration is not shared), and a reload that changes the engine's models
    (a new ``Backend`` under the same name and URL) makes it a new engine."""
    async with _engine() as (engine, url), aiohttp.ClientSession() as session:
        backend = Backend(name="vllm-0", url=url, models=frozenset({"m"}),
                          discover_profile=False)
        registry = BackendRegistry([backend])
        scrapes = ScrapeShare("gw-1", fresh_s=60.0)
        fleet = FleetSync(registry, None, session, discover_workers=False, scrapes=scrapes)
        scrapes.merge("gw-2", orjson.dumps({"vllm-0": [1, 0, 0.1]}))
        await fleet.scrape_metrics()
        assert len(engine.scrapes) == 1 and fleet.num_scrapes_read == 1  # never read here
        await fleet.scrape_metrics()
        assert len(engine.scrapes) == 1  # fresh: the scrape of the round before
        entry = scrapes.entry()
        assert entry is not None and orjson.loads(entry["m"]) == {"vllm-0": [2, 1, 0.5]}
        registry.remove("vllm-0")  # as gateway/reload.py replaces it
        registry.add(Backend(name="vllm-0", url=url, models=frozenset({"m", "m2"}),
                             discover_profile=False))
        await fleet.scrape_metrics()
        assert len(engine.scrapes) == 2

