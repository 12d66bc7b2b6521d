"""Gateway replicas tell each other what they have in flight on each backend: in process, and
through a real Redis stream shared with the approximate index."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import redis.asyncio as aioredis

from backends.fleet.approx_sync import APPROX_STREAM, ApproxIndexSync
from backends.fleet.peer_load import LOAD_FIELD, PeerLoad
from backends.fleet.registry import Backend, BackendRegistry
from routing.index_approx import ApproxPrefixIndex
from tests.backends.fleet.pair import two_replicas


def _registry() -> BackendRegistry:
    return BackendRegistry([Backend(name=n, url=f"http://{n}", models=frozenset({"m"}))
                            for n in ("a", "b")])


def _send(registry: BackendRegistry, name: str, count: int) -> None:
    backend = registry.get(name)
    assert backend is not None
    for _ in range(count):
        backend.book_started(reserved_tokens=100, pending_prefill_tokens=40)


def test_entries_carry_changes_and_keepalives_only() -> None:
    registry = _registry()
    peers = PeerLoad(registry, "gw-1", keepalive_s=1.0)
    first = peers.entry(now_s=10.0)
    assert first is not None and orjson.loads(first["l"]) == {}
    _send(registry, "a", 1)
    assert peers.entry(now_s=10.05) is None  # alone: nobody to tell until the keepalive
    peers.merge("gw-2", orjson.dumps({}), now_s=10.05)  # another replica is heard
    assert peers.entry(now_s=10.1) is not None
    assert peers.entry(now_s=10.15) is None  # nothing changed
    _send(registry, "a", 1)
    changed = peers.entry(now_s=10.2)
    # Between keepalives, only the rows that changed ("d"); an earlier version, which reads
    # "l" alone, takes it for a claim on nothing: no backend, no hashes.
    assert changed is not None and orjson.loads(changed["d"]) == {"a": [2, 200, 80, 0, 0, 0]}
    assert "l" not in changed
    assert changed["b"] == "" and changed["h"] == b"" and float(changed["t"]) > 0
    assert peers.entry(now_s=10.3) is None
    _send(registry, "b", 1)
    only_b = peers.entry(now_s=10.4)
    assert only_b is not None and orjson.loads(only_b["d"]) == {"b": [1, 100, 40, 0, 0, 0]}
    keepalive = peers.entry(now_s=11.3)  # every row, as a first-version replica reads them
    assert keepalive is not None and orjson.loads(keepalive["l"]) == {
        "a": [2, 200, 80, 0, 0, 0], "b": [1, 100, 40, 0, 0, 0]}


def test_a_delta_changes_only_its_rows_and_a_zero_row_removes_one() -> None:
    registry = _registry()
    a, b = registry.get("a"), registry.get("b")
    assert a is not None and b is not None
    peers = PeerLoad(registry, "gw-1")
    peers.merge("gw-2", orjson.dumps({"a": [2, 200, 0, 0], "b": [1, 100, 0, 0]}), now_s=0.0)
    peers.merge("gw-2", orjson.dumps({"a": [5, 500, 0, 1, 0, 0]}), now_s=0.1, is_delta=True)
    peers.apply(now_s=0.1)
    assert (a.peer_in_flight, a.peer_ending, b.peer_in_flight) == (5, 1, 1)
    peers.merge("gw-2", orjson.dumps({"b": [0, 0, 0, 0, 1, 0]}), now_s=0.2, is_delta=True)
    peers.apply(now_s=0.2)
    assert (a.peer_in_flight, b.peer_in_flight, b.peer_finished_since_load) == (5, 0, 1)
    # A full entry replaces what was known: a row it lacks is gone.
    peers.merge("gw-2", orjson.dumps({"b": [3, 300, 0, 0]}), now_s=0.3)
    peers.apply(now_s=0.3)
    assert (a.peer_in_flight, b.peer_in_flight) == (0, 3)


def test_the_others_counts_add_to_routings_view_and_expire() -> None:
    registry = _registry()
    peers = PeerLoad(registry, "gw-1", expire_s=3.0)
    _send(registry, "a", 1)
    peers.merge(b"gw-2", orjson.dumps({"a": [3, 300, 120], "b": [1, 50, 0]}), now_s=0.0)
    peers.merge("gw-3", orjson.dumps({"a": [2, 200, 0]}), now_s=1.0)
    peers.merge("gw-1", orjson.dumps({"a": [99, 0, 0]}), now_s=1.0)  # its own: ignored
    peers.merge("gw-4", b"not json", now_s=1.0)  # malformed: ignored
    peers.merge("gw-5", orjson.dumps({"a": "x"}), now_s=1.0)
    peers.apply(now_s=2.0)
    a, b = registry.get("a"), registry.get("b")
    assert a is not None and b is not None
    assert (a.peer_in_flight, a.peer_in_flight_tokens, a.peer_in_flight_prompt_tokens) == \
        (5, 500, 120)
    state = a.state(2.0)
    assert (state.num_in_flight, state.num_in_flight_tokens) == (6, 600)
    assert state.num_in_flight_prompt_tokens == 160
    assert b.state(2.0).num_in_flight == 1 and peers.num_peers == 2
    peers.apply(now_s=3.5)  # gw-2 silent for 3.5 s: gone
    assert (a.peer_in_flight, b.peer_in_flight) == (2, 0) and peers.num_peers == 1


def test_finishes_and_first_tokens_travel_as_changes_until_the_next_observation() -> None:
    """A replica tells the finishes and counted first tokens since its last entry; the others
    subtract them from the engine's last figures, as their own, until they observe it again."""
    sender, receiver = _registry(), _registry()
    a = sender.get("a")
    assert a is not None
    a.load_observed(5.0)
    _send(sender, "a", 3)  # sent at 4.0, before the engine's figures of 5.0
    peers_out = PeerLoad(sender, "gw-2")
    peers_out.merge("gw-1", orjson.dumps({}), now_s=5.5)  # the receiver is listening
    for _ in range(2):
        a.book_first_token(pending_prefill_tokens=40, sent_s=4.0)  # counted waiting, runs now
    a.book_finished(100, 0, had_first_token=True, was_ending=False)
    entry = peers_out.entry(now_s=6.0)
    assert entry is not None and orjson.loads(entry["l"]) == {"a": [2, 200, 40, 0, 1, 2]}
    again = peers_out.entry(now_s=6.1)
    assert again is None  # the changes went with the last entry; the levels are the same
    a.book_finished(100, 0, had_first_token=True, was_ending=False)
    a.book_finished(100, 40, had_first_token=False, was_ending=False)
    last = peers_out.entry(now_s=6.2)
    assert last is not None and orjson.loads(last["d"]) == {"a": [0, 0, 0, 0, 2, 0]}

    seen = receiver.get("a")
    assert seen is not None
    seen.num_running, seen.num_waiting = 6, 4  # the engine's figures, read at 5.0
    seen.load_observed(5.0)
    peers_in = PeerLoad(receiver, "gw-1")
    peers_in.merge("gw-2", entry["l"], now_s=6.0)
    peers_in.merge("gw-2", last["d"], now_s=6.2, is_delta=True)
    peers_in.apply(now_s=6.2)
    assert (seen.peer_finished_since_load, seen.peer_started_since_load) == (3, 2)
    state = seen.state(6.2)
    # 2 of the 4 waiting started (6 + 2 = 8 running), then 3 finished.
    assert (state.num_running, state.num_waiting) == (5, 2)
    seen.load_observed(7.0)  # a new observation counts them all itself
    assert (seen.peer_finished_since_load, seen.peer_started_since_load) == (0, 0)
    assert seen.state(7.0).num_running == 6


def test_a_first_version_replicas_entry_counts_levels_only() -> None:
    registry = _registry()
    a = registry.get("a")
    assert a is not None
    a.load_source = "books"
    peers = PeerLoad(registry, "gw-1")
    peers.merge("gw-old", orjson.dumps({"a": [3, 300, 0]}), now_s=0.0)
    peers.merge("gw-new", orjson.dumps({"a": [1, 100, 0, 1, 0, 0]}), now_s=0.0)
    peers.merge("gw-bad", orjson.dumps({"a": [1, 2]}), now_s=0.0)  # too short: ignored
    peers.apply(now_s=0.0)
    assert (a.peer_in_flight, a.peer_ending, peers.num_peers) == (4, 1, 2)
    # A stream on its last step frees its slot for routing, whichever replica sent it.
    assert a.state(0.0).num_ending == 1


def test_history_before_the_first_entry_is_not_told() -> None:
    registry = _registry()
    a = registry.get("a")
    assert a is not None
    _send(registry, "a", 1)
    a.book_finished(100, 40, had_first_token=False, was_ending=False)
    entry = PeerLoad(registry, "gw-1").entry(now_s=0.0)
    assert entry is not None and orjson.loads(entry["l"]) == {}


def test_books_only_backends_count_the_peers_requests_as_running() -> None:
    registry = _registry()
    a = registry.get("a")
    assert a is not None
    a.load_source = "books"
    PeerLoad(registry, "gw-1")  # nothing heard yet
    assert a.state(0.0).num_running == 0
    peers = PeerLoad(registry, "gw-1")
    peers.merge("gw-2", orjson.dumps({"a": [4, 400, 0]}), now_s=0.0)
    peers.apply(now_s=0.0)
    assert a.state(0.0).num_running == 4


async def test_replicas_hear_each_others_load_through_the_stream(
        approx_redis: aioredis.Redis) -> None:
    registries = [_registry(), _registry()]
    tasks = []
    for name, registry in zip(("gw-1", "gw-2"), registries, strict=True):
        sync = ApproxIndexSync(approx_redis, ApproxPrefixIndex(ttl_s=60), name, ttl_s=60,
                               flush_interval_s=0.02, peers=PeerLoad(registry, name))
        await sync.catch_up()
        tasks.append(asyncio.create_task(sync.run()))
    try:
        _send(registries[0], "b", 3)
        deadline = time.monotonic() + 3
        seen = registries[1].get("b")
        assert seen is not None
        while time.monotonic() < deadline and seen.peer_in_flight != 3:
            await asyncio.sleep(0.01)
        assert seen.peer_in_flight == 3 and seen.num_in_flight == 0
        entries: Any = await approx_redis.xrange(APPROX_STREAM)
        assert any(LOAD_FIELD in fields for _, fields in entries)
        # The requests end: the other replica hears that too.
        backend = registries[0].get("b")
        assert backend is not None
        for _ in range(3):
            backend.book_finished(100, 40, had_first_token=False, was_ending=False)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and seen.peer_in_flight:
            await asyncio.sleep(0.01)
        assert seen.peer_in_flight == 0 and seen.peer_finished_since_load == 3
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_counts_that_fall_wait_for_a_dispatch_or_the_lazy_interval(
        approx_redis: aioredis.Redis) -> None:
    """A finish (``notify(urgent=False)``) reaches the other replica only after the lazy
    interval, unless a dispatch (``notify()``) goes first and carries it."""
    registries = [_registry(), _registry()]
    sender = registries[0].get("b")
    seen = registries[1].get("b")
    assert sender is not None and seen is not None

    async def until(level: int, timeout_s: float) -> float:
        started_s = time.monotonic()
        while time.monotonic() - started_s < timeout_s and seen.peer_in_flight != level:
            await asyncio.sleep(0.005)
        assert seen.peer_in_flight == level
        return time.monotonic() - started_s

    async with two_replicas(approx_redis, registries, flush_interval_s=5.0,
                            lazy_interval_s=1.0) as syncs:
        _send(registries[0], "b", 3)
        syncs[0].notify()
        await until(3, timeout_s=2.0)
        sender.book_finished(100, 40, had_first_token=False, was_ending=False)
        syncs[0].notify(urgent=False)
        await asyncio.sleep(0.5)
        assert seen.peer_in_flight == 3  # half the lazy interval on: not sent yet
        assert await until(2, timeout_s=2.0) >= 0.3  # sent at 1 s
        sender.book_finished(100, 40, had_first_token=False, was_ending=False)
        syncs[0].notify(urgent=False)
        _send(registries[0], "a", 1)
        syncs[0].notify()  # a dispatch: out at once, with the finish
        await until(1, timeout_s=0.8)
        assert registries[1].get("a").peer_in_flight == 1  # type: ignore[union-attr]
