"""Two gateway replicas' approximate prefix indexes converge through a real Redis stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis

from backends.fleet.approx_sync import (
    APPROX_STREAM,
    ApproxIndexSync,
    lesson_fields,
    lesson_of,
    xadd_command,
)
from backends.publisher import pack_hashes, unpack_hashes
from backends.resp import RespAddress, RespConnection, stream_entries
from routing.index_approx import ApproxPrefixIndex
from routing.prefix import char_block_hashes


@pytest.fixture(params=[True, False], ids=["plain-resp", "redis-py"])
def plain_resp(request: pytest.FixtureRequest) -> bool:
    """Whether the replicas' loops use their own plain connections (``backends.resp``) or
    redis-py's client."""
    return bool(request.param)


async def _until(predicate: object, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.01)
    return False


@asynccontextmanager
async def _two_replicas(redis: aioredis.Redis, plain_resp: bool, **options: Any
                        ) -> AsyncIterator[list[tuple[ApproxPrefixIndex, ApproxIndexSync]]]:
    """Replicas gw-1 and gw-2, caught up and running until the block ends (then cancelled)."""
    replicas, tasks = [], []
    for name in ("gw-1", "gw-2"):
        index = ApproxPrefixIndex(ttl_s=60)
        sync = ApproxIndexSync(redis, index, name, ttl_s=60, is_plain_resp=plain_resp,
                               **options)
        await sync.catch_up()
        replicas.append((index, sync))
        tasks.append(asyncio.create_task(sync.run()))
    try:
        yield replicas
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:  # a loop that outlives its cancellation fails here, not hangs
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)


async def test_two_replicas_converge_and_a_late_one_catches_up(
        approx_redis: aioredis.Redis, plain_resp: bool) -> None:
    text_a = "system prompt of tenant A " * 20
    text_b = "system prompt of tenant B " * 20
    chain_a = tuple(char_block_hashes(text_a, 64, "m"))
    chain_b = tuple(char_block_hashes(text_b, 64, "m"))
    async with _two_replicas(approx_redis, plain_resp, flush_interval_s=0.02) as replicas:
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
        approx_redis: aioredis.Redis, plain_resp: bool) -> None:
    """The stream was empty when the catch-up read it; another replica's entry landed, stamped
    by Redis's clock, before the reply reached this replica: the read that follows still gets it."""
    chain = tuple(char_block_hashes("a prompt sent just then " * 10, 64, "m"))
    index = ApproxPrefixIndex(ttl_s=60)
    sync = ApproxIndexSync(approx_redis, index, "gw-1", ttl_s=60, flush_interval_s=0.02,
                           is_plain_resp=plain_resp)
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
        approx_redis: aioredis.Redis, plain_resp: bool) -> None:
    """With ``push_interval_s``, a decision goes out within that long although both replicas'
    XREADs block for 5 s (nothing else is added)."""
    chain = tuple(char_block_hashes("system prompt of tenant C " * 20, 64, "m"))
    async with _two_replicas(approx_redis, plain_resp, flush_interval_s=5.0,
                             push_interval_s=0.005) as replicas:
        (_, sync_1), (index_2, _) = replicas
        await asyncio.sleep(0.1)  # both XREADs are blocking now
        sync_1.record(chain, "w1", time.time())
        assert await _until(lambda: index_2.match(chain, time.time()).num_blocks.get("w1")
                            == len(chain), timeout_s=1.0)


async def test_a_flush_reaches_a_blocked_reader_in_one_reply(
        approx_redis: aioredis.Redis, plain_resp: bool) -> None:
    """Two claims and a lesson flushed together wake a blocked reader once, with all three
    (a transaction; in a plain pipeline the reader would get the first and come back)."""
    reader = RespConnection(RespAddress.of(approx_redis) or _no_address(), timeout_s=2.0)
    read = asyncio.create_task(reader.xread({APPROX_STREAM: "$"}, count=100, block_ms=5000))
    await asyncio.sleep(0.1)
    sync = ApproxIndexSync(approx_redis, ApproxPrefixIndex(ttl_s=60), "gw-1", ttl_s=60,
                           flush_interval_s=5.0, is_plain_resp=plain_resp)
    now_s = time.time()
    sync.record(tuple(char_block_hashes("first prompt " * 20, 64, "m")), "w0", now_s)
    sync.record(tuple(char_block_hashes("second prompt " * 20, 64, "m")), "w1", now_s)
    sync.lesson("w0", 5.0, False)
    task = asyncio.create_task(sync.run())  # plain: its writer flushes; redis-py: the reader
    try:
        ((_, entries),) = await asyncio.wait_for(read, 3)
        assert [fields[b"b"] for _, fields in entries] == [b"w0", b"w1", b"w0"]
        assert b"o" in entries[2][1]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        await reader.aclose()


def _no_address() -> RespAddress:
    raise AssertionError("the test Redis client is a plain one")


async def test_what_a_response_taught_one_replica_reaches_the_others(
        approx_redis: aioredis.Redis, plain_resp: bool) -> None:
    """A miss on a 5 s old claim shortens w0's claim lifetime on the replica that saw it; the
    lesson goes out through the stream and the other replica shortens w0's too (its own
    responses never touched w0), and so does a replica that starts later, catching up."""
    async with _two_replicas(approx_redis, plain_resp, flush_interval_s=0.02) as replicas:
        (index_1, sync_1), (index_2, _) = replicas
        assert index_1.observe("w0", claim_age_s=5.0, is_hit=False)  # the router's learn()
        sync_1.lesson("w0", 5.0, False)  # its on_lesson hook
        assert await _until(lambda: index_2.ttl_for("w0") == pytest.approx(5.0))
        assert index_2.ttl_for("w1") == 60  # nothing said of w1
        assert index_1.ttl_for("w0") == pytest.approx(5.0)  # its own lesson is not applied twice
    late = ApproxPrefixIndex(ttl_s=60)
    await ApproxIndexSync(approx_redis, late, "gw-3", ttl_s=60).catch_up()
    assert late.ttl_for("w0") == pytest.approx(5.0)


def test_lesson_entries_round_trip_and_malformed_ones_teach_nothing() -> None:
    fields = lesson_fields("gw-1", ("w0", 5.25, True))
    assert lesson_of(fields) == ("w0", 5.25, True)
    as_read = {k.encode(): v if isinstance(v, bytes) else v.encode()  # what XREAD returns
               for k, v in fields.items()}
    assert lesson_of(as_read) == ("w0", 5.25, True)
    assert lesson_of({b"r": b"gw-1", b"b": b"w0", b"t": b"1.0", b"h": b""}) is None  # a claim
    for bad in ({b"o": b"maybe", b"b": b"w0", b"a": b"1"}, {b"o": b"miss", b"b": b"w0"},
                {b"o": b"miss", b"b": b"w0", b"a": b"soon"}, {b"o": b"hit", b"a": b"1"}):
        assert lesson_of(bad) is None, bad


async def test_a_malformed_lesson_is_skipped_and_the_reader_goes_on(
        approx_redis: aioredis.Redis, plain_resp: bool) -> None:
    async with _two_replicas(approx_redis, plain_resp, flush_interval_s=0.02) as replicas:
        (_, _), (index_2, _) = replicas
        await approx_redis.xadd(APPROX_STREAM, {"r": "gw-9", "b": "w0", "o": "miss", "a": "x"})
        await approx_redis.xadd(APPROX_STREAM, {"r": "gw-9", "b": "w1", "o": "miss", "a": "4"})
        assert await _until(lambda: index_2.ttl_for("w1") == pytest.approx(4.0))
        assert index_2.ttl_for("w0") == 60


def test_a_lesson_reads_as_a_claim_on_nothing_to_an_earlier_version() -> None:
    """An earlier replica's reader knows claims (``b``, ``t``, ``h``) and counts only: a
    lesson must parse as a claim on no hashes there, not break its reader."""
    fields = {k.encode(): v if isinstance(v, bytes) else v.encode()
              for k, v in lesson_fields("gw-1", ("w0", 5.0, False)).items()}
    assert fields[b"b"] == b"w0" and float(fields[b"t"]) > 0
    assert list(unpack_hashes(fields[b"h"])) == []


async def test_malformed_claims_are_skipped_and_the_reader_goes_on(
        approx_redis: aioredis.Redis, plain_resp: bool) -> None:
    """Entries no version wrote (a claim without a backend, a time that is no number, hashes
    that are not whole uint64s, no fields the reader knows) are counted and skipped; the claim
    after them is merged."""
    chain = tuple(char_block_hashes("a claim after the junk " * 10, 64, "m"))
    async with _two_replicas(approx_redis, plain_resp, flush_interval_s=0.02) as replicas:
        (_, _), (index_2, sync_2) = replicas
        for junk in ({"r": "gw-9", "t": "1.0", "h": b""}, {"r": "gw-9", "b": "w0", "t": "soon",
                                                          "h": b""},
                     {"r": "gw-9", "b": "w0", "t": "1.0", "h": b"\x01\x02\x03"},
                     {"x": "y"}):
            await approx_redis.xadd(APPROX_STREAM, junk)  # type: ignore[arg-type]
        await approx_redis.xadd(APPROX_STREAM, {"r": "gw-9", "b": "w2", "t": f"{time.time():.3f}",
                                                "h": pack_hashes(chain)})
        assert await _until(lambda: index_2.match(chain, time.time()).num_blocks.get("w2")
                            == len(chain))
        assert sync_2.num_malformed == 4


def test_an_xread_reply_as_resp2_sends_it_reads_as_redis_py_gives_it() -> None:
    raw = [[b"sy:approx", [[b"1-0", [b"r", b"gw-1", b"b", b"w0"]], [b"2-0", None],
                           [b"3-0", [b"r", b"gw-2"]]]]]
    assert stream_entries(raw) == [(b"sy:approx", [(b"1-0", {b"r": b"gw-1", b"b": b"w0"}),
                                                   (b"3-0", {b"r": b"gw-2"})])]
    assert stream_entries(None) == []
    assert xadd_command({"r": "gw-1", "h": b"\x00"}, 100) == [
        "XADD", APPROX_STREAM, "MAXLEN", "~", 100, "*", "r", "gw-1", "h", b"\x00"]


class _SlowReplies:
    """A loopback TCP relay to Redis that passes requests at once and holds every reply
    ``delay_s``: a Redis far away for answers only. ``cut()`` drops every connection through
    it, as a network fault would."""

    def __init__(self, redis_port: int, delay_s: float) -> None:
        self.redis_port = redis_port
        self.delay_s = delay_s
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> _SlowReplies:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def cut(self) -> None:
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def _relay(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection("127.0.0.1", self.redis_port)
        self._writers += [client_w, redis_w]
        for task in (asyncio.create_task(self._pipe(client_r, redis_w, 0.0)),
                     asyncio.create_task(self._pipe(redis_r, client_w, self.delay_s))):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    delay_s: float) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if delay_s:
                    await asyncio.sleep(delay_s)  # in order: one chunk after another
                writer.write(data)
                await writer.drain()
        writer.transport.abort()


async def _claims_on(redis: aioredis.Redis, backends: set[bytes], count: int
                     ) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The stream's claims on ``backends``, once there are ``count`` (or after 5 s)."""
    deadline = time.monotonic() + 5
    while True:
        claims = [(i, f) for i, f in await redis.xrange(APPROX_STREAM)
                  if f.get(b"b") in backends]
        if len(claims) >= count or time.monotonic() > deadline:
            return claims
        await asyncio.sleep(0.01)


@asynccontextmanager
async def _writer_through(relay: _SlowReplies) -> AsyncIterator[ApproxIndexSync]:
    """A replica whose Redis is ``relay``, running (its writer 1 ms apart) until the block
    ends."""
    client = aioredis.Redis(host="127.0.0.1", port=relay.port)
    sync = ApproxIndexSync(client, ApproxPrefixIndex(ttl_s=60), "gw-1", ttl_s=60,
                           flush_interval_s=5.0, push_interval_s=0.001)
    task = asyncio.create_task(sync.run())
    try:
        await asyncio.sleep(0.1)  # connected, the first keepalive sent
        yield sync
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        await client.aclose()


def _decide(sync: ApproxIndexSync, prompt: str, backend: str) -> None:
    sync.record(tuple(char_block_hashes(prompt * 20, 64, "m")), backend, time.time())


async def test_the_writer_sends_a_change_before_the_last_flush_is_answered(
        approx_redis: aioredis.Redis) -> None:
    """On its own connection the writer's next flush does not wait for the last one's reply:
    two decisions 20 ms apart reach Redis about 20 ms apart although each reply takes 300 ms
    to come back (waiting for it, the second would land 300 ms after the first)."""
    port = approx_redis.connection_pool.connection_kwargs["port"]
    async with _SlowReplies(port, 0.3) as relay, _writer_through(relay) as sync:
        _decide(sync, "the first prompt ", "w0")
        await asyncio.sleep(0.02)
        _decide(sync, "the second prompt ", "w1")
        claims = await _claims_on(approx_redis, {b"w0", b"w1"}, 2)
        assert [f[b"b"] for _, f in claims] == [b"w0", b"w1"]
        first_ms, second_ms = (int(i.split(b"-")[0]) for i, _ in claims)
        assert 0 <= second_ms - first_ms < 200


async def test_flushes_lost_on_their_way_are_sent_again(approx_redis: aioredis.Redis) -> None:
    """The connection drops while two flushes wait for their replies: both failed, their
    claims go out again once the writer reconnects (a claim may land twice: claims are
    idempotent), and the writer goes on."""
    port = approx_redis.connection_pool.connection_kwargs["port"]
    async with _SlowReplies(port, 0.5) as relay, _writer_through(relay) as sync:
        await approx_redis.delete(APPROX_STREAM)  # the keepalive's entry
        relay.delay_s = 5.0  # the next replies never come in time
        _decide(sync, "lost prompt one ", "w0")
        await asyncio.sleep(0.02)
        _decide(sync, "lost prompt two ", "w1")
        await asyncio.sleep(0.1)  # both flushes sent, their replies held
        relay.delay_s = 0.0
        relay.cut()
        await approx_redis.delete(APPROX_STREAM)  # what landed before the cut: forgotten
        claims = await _claims_on(approx_redis, {b"w0", b"w1"}, 2)
        assert sorted(f[b"b"] for _, f in claims) == [b"w0", b"w1"]
        _decide(sync, "after the fault ", "w2")
        assert [f[b"b"] for _, f in await _claims_on(approx_redis, {b"w2"}, 1)] == [b"w2"]


async def test_a_cancelled_sync_leaves_no_handled_exception_behind(
        approx_redis: aioredis.Redis) -> None:
    """Compiled (``routing.native``), a ``finally`` block with an await left each cancellation
    as the thread's handled exception, and every exception raised later chained onto it."""
    for _ in range(3):
        sync = ApproxIndexSync(approx_redis, ApproxPrefixIndex(ttl_s=60), "gw-1", ttl_s=60)
        task = asyncio.create_task(sync.run())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with pytest.raises(ValueError) as raised:
        raise ValueError("a probe")
    assert raised.value.__context__ is None
