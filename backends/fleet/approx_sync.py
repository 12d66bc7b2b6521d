"""Share the approximate prefix index across gateway replicas through a Redis stream.

Each replica records its own routing decisions locally (``ApproxPrefixIndex.record``) and
appends them, batched every ``flush_interval_s``, to the stream ``sy:approx`` (fields ``r`` the
replica, ``b`` the backend, ``t`` unix seconds, ``h`` the character-block hashes packed as
little-endian uint64). Every replica reads the stream and merges the others' claims, so they
agree on who holds what within about one flush interval plus a read. A replica that starts
reads the last ``ttl_s`` of the stream first (stream ids are millisecond timestamps), so it
catches up with no extra state, then reads on from the last entry it saw (from the start of that
range when it saw none), so an entry added while the catch-up's reply travelled is not missed.
The stream is trimmed to about ``stream_maxlen`` entries.

The replicas also share what the responses taught them (``lesson``): when a response changed a
backend's claim lifetime in this replica's index (``ApproxPrefixIndex.observe``: a miss on a
claim of some age shortens it, hits near it let it grow back), the observation goes out as an
entry of its own (fields ``r``, ``b``, ``a`` the claim's age in seconds, ``o`` ``hit`` or
``miss``; and ``t``, ``h`` empty, so a replica of an earlier version reads a claim on nothing),
and every other replica applies it to its own index. Each replica otherwise hears
only its own 1/N of the responses, and would go on trusting claims on a backend that evicted
them until a request of its own missed there (in virtual time, sharing the lessons took the
misses of 2 and 4 replicas under KV pressure back to one replica's: ``docs/benchmarks/vsim.md``).
Lessons are rare: a lifetime changes on misses and on hits near it, not on every response.

Another kind of entry carries a replica's ``/metrics`` scrapes of the listed engines
(``backends.fleet.scrape_share``): the others take the figures instead of scraping the engines
themselves.

Each flush's entries go in one ``MULTI`` / ``EXEC`` (Redis answers a reader blocked in
``XREAD`` after each command of a plain pipeline, and it would come back for the rest), and a
change that only lowers this replica's counts waits up to ``lazy_interval_s`` for a dispatch to
go with (``notify``): at light load a request's changes then take about two flushes, not four.

A decision the others already heard is not sent again: the same prompt prefix (its last block
hash, which the chain makes stand for the whole prefix) sent to the same backend within
``republish_s`` (0.25 s, a quarter of the shortest claim lifetime ``MIN_TTL_S``) is dropped, so
a hot prompt costs Redis a few stream entries a second, not one per request; the others' claim
on it is at most that much older than this replica's.

Example::

    sync = ApproxIndexSync(redis, router.approx_index, replica_id="gw-1", ttl_s=600)
    router.on_record = sync.record
    await sync.catch_up()
    task = asyncio.create_task(sync.run())
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

from backends.fleet.peer_load import PeerLoad, load_of
from backends.fleet.scrape_share import SCRAPE_FIELD, ScrapeShare
from backends.publisher import pack_hashes, unpack_hashes
from backends.redis_url import REDIS_ERRORS, pipelined, raise_if_cancelled
from backends.resp import RESP_TIMEOUT_S, Arg, RespAddress, RespConnection
from routing.index_approx import MIN_TTL_S, ApproxPrefixIndex

log = logging.getLogger(__name__)

APPROX_STREAM = "sy:approx"
MAX_REMEMBERED = 65_536  # (prefix, backend) pairs whose last send is remembered
Lesson = tuple[str, float, bool]  # (backend, claim age in seconds, hit): ApproxPrefixIndex.observe
FLUSH_INTERVAL_S = 0.1  # the batching interval without a writer task, and the XREAD's block
PUSH_INTERVAL_S: float | None = 0.001  # the writer task's wait after a flush (None: no writer)
LAZY_INTERVAL_S = 0.05  # how long a change that only lowers the counts waits for company
# ...unless it is a first token (or an end before one) that takes at least this many prompt
# tokens of prefill off a backend's books (Router.falls_urgently): a cache miss's, not a hit's.
URGENT_PREFILL_TOKENS = 512
MAX_UNANSWERED = 8  # flushes the writer may have on their way at once (its own connection)


async def _end(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them to end."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _settle(flushes: deque[asyncio.Future[None]]) -> BaseException | None:
    """Take the flushes at the front of ``flushes`` that are done; the first Redis error
    among them (any other error is raised: a bug, not an outage)."""
    error: BaseException | None = None
    while flushes and flushes[0].done():
        exc = flushes.popleft().exception()
        if exc is not None:
            if not isinstance(exc, REDIS_ERRORS):
                raise exc
            error = error or exc
    return error


def lesson_fields(replica_id: str, lesson: Lesson) -> dict[Any, Any]:
    """The stream entry of a lesson (module docstring). It carries a claim's fields too, on
    no hashes (``t`` now, ``h`` empty), so a replica of an earlier version reads it as a claim
    on nothing."""
    backend, claim_age_s, is_hit = lesson
    return {"r": replica_id, "b": backend, "t": f"{time.time():.3f}", "h": b"",
            "a": f"{claim_age_s:.3f}", "o": "hit" if is_hit else "miss"}


def lesson_of(fields: Mapping[Any, Any]) -> Lesson | None:
    """A lesson from its entry's fields as read from Redis (bytes keys) or as
    ``lesson_fields`` made them; None when the entry is not one (a claim)."""
    outcome = fields.get(b"o", fields.get("o"))
    if outcome is None:
        return None
    backend = fields.get(b"b", fields.get("b"))
    age = fields.get(b"a", fields.get("a"))
    if isinstance(outcome, bytes):
        outcome = outcome.decode()
    if isinstance(backend, bytes):
        backend = backend.decode()
    if not isinstance(backend, str) or age is None or outcome not in ("hit", "miss"):
        return None  # a malformed entry: nothing to learn from it
    try:
        claim_age_s = float(age)
    except ValueError:
        return None
    return backend, claim_age_s, outcome == "hit"


def xadd_command(fields: Mapping[Any, Any], maxlen: int) -> list[Arg]:
    """``XADD sy:approx MAXLEN ~ maxlen * field value ...`` for a plain connection."""
    command: list[Arg] = ["XADD", APPROX_STREAM, "MAXLEN", "~", maxlen, "*"]
    for key, value in fields.items():
        command += (key, value)
    return command


class ApproxIndexSync:
    def __init__(
        self,
        redis: aioredis.Redis,
        index: ApproxPrefixIndex,
        replica_id: str,
        *,
        ttl_s: float,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        stream_maxlen: int = 200_000,
        republish_s: float = MIN_TTL_S / 4,
        peers: PeerLoad | None = None,
        push_interval_s: float | None = PUSH_INTERVAL_S,
        lazy_interval_s: float = LAZY_INTERVAL_S,
        is_plain_resp: bool = True,
        scrapes: ScrapeShare | None = None,
    ) -> None:
        self._redis = redis
        # The replicas' shared /metrics scrapes (backends.fleet.scrape_share): what this one
        # read goes out with the next flush, what the others read is handed to it.
        self._scrapes = scrapes
        if scrapes is not None:
            scrapes.on_queued = self.notify
        # The read and write loops' own connections, RESP by hand (backends.resp), where the
        # client is a plain one: a few times less CPU per entry than redis-py's.
        self._address = RespAddress.of(redis) if is_plain_resp else None
        self._index = index
        self._peers = peers
        self.replica_id = replica_id
        self._ttl_s = ttl_s
        self._flush_interval_s = flush_interval_s
        # Not None: a writer task of its own (on its own connection) flushes as soon as
        # ``notify`` says something changed, then waits push_interval_s before it flushes
        # again (the cap on its rate; the last flush's reply may still be on its way: see
        # ``_write_loop``), so a change goes out at once even while XREAD blocks. None: the
        # read loop flushes before each XREAD, and a change waits for the next XREAD reply:
        # up to flush_interval_s when no other replica adds anything.
        self._push_interval_s = push_interval_s
        # A change that only lowers this replica's counts (a first token, a stream's last
        # step, a finish: ``notify(urgent=False)``) waits up to lazy_interval_s for the next
        # dispatch or another such change to go out with: at light load a request's changes
        # take about two flushes, not four, and every other replica wakes that much less.
        # Counts that fall late make the others route a little away from a backend, never
        # pile onto it; a dispatch (a rise) and a lesson go at once.
        self._lazy_interval_s = lazy_interval_s
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._changed = asyncio.Event()
        self._stream_maxlen = stream_maxlen
        self._pending: list[tuple[tuple[int, ...], str, float]] = []
        self._lessons: list[Lesson] = []
        self._last_id: bytes | str = "$"
        self._republish_s = republish_s
        self._published: dict[tuple[int, str], float] = {}  # (last hash, backend) -> when
        self._writer: RespConnection | None = None
        self.num_merged = 0
        self.num_unsent = 0  # decisions not sent: the same prefix and backend, just sent
        self.num_malformed = 0  # entries that were no claim, count or lesson: skipped

    def record(self, char_hashes: tuple[int, ...], backend: str, recorded_s: float) -> None:
        """Queue a local decision for the other replicas, unless the same one went within
        ``republish_s``; never blocks."""
        if not char_hashes:
            return
        key = (char_hashes[-1], backend)
        published = self._published
        last_s = published.get(key)
        if last_s is not None and 0.0 <= recorded_s - last_s < self._republish_s:
            self.num_unsent += 1
            return
        if len(published) >= MAX_REMEMBERED:
            published.clear()  # forgetting costs one extra entry per prefix, nothing else
        published[key] = recorded_s
        self._pending.append((char_hashes, backend, recorded_s))
        self._changed.set()

    def lesson(self, backend: str, claim_age_s: float, is_hit: bool) -> None:
        """Queue what a response taught this replica about ``backend``'s claims (the
        ``Router.on_lesson`` hook: it changed the claim lifetime here) for the others; never
        blocks."""
        self._lessons.append((backend, claim_age_s, is_hit))
        self._changed.set()

    def take_pending(self) -> list[tuple[tuple[int, ...], str, float]]:
        """The decisions queued since the last flush, handed over (the next flush sends none
        of them): the virtual-time simulator's way to send them (``bench.vsim.approx_share``)."""
        pending, self._pending = self._pending, []
        return pending

    def take_lessons(self) -> list[Lesson]:
        """The lessons queued since the last flush, handed over (the next flush sends none)."""
        lessons, self._lessons = self._lessons, []
        return lessons

    def notify(self, urgent: bool = True) -> None:
        """This replica's books changed (``Router.on_booked``): the writer flushes its counts
        soon, at once when ``urgent`` (a dispatch), else within ``lazy_interval_s`` (a change
        that only lowers them); never blocks."""
        if urgent or self._lazy_interval_s <= 0:
            self._changed.set()
        elif self._lazy_timer is None:
            self._lazy_timer = asyncio.get_running_loop().call_later(
                self._lazy_interval_s, self._lazy_due)

    def _lazy_due(self) -> None:
        self._lazy_timer = None
        self._changed.set()

    def _cancel_lazy(self) -> None:
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None

    async def catch_up(self) -> None:
        """Merge the claims other replicas made within the last ``ttl_s``."""
        since_ms = int((time.time() - self._ttl_s) * 1000)
        entries: Any = await self._redis.xrange(APPROX_STREAM, min=f"{since_ms}-0", max="+",
                                                count=self._stream_maxlen)
        self._merge(entries)
        # With nothing in range, read on from the range's start, not from now: an entry another
        # replica added while this reply was on its way carries an id older than "now" here.
        self._last_id = entries[-1][0] if entries else f"{since_ms}-0"

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        lessons = self.take_lessons()
        load = self._peers.entry() if self._peers is not None else None
        scraped = self._scrapes.entry() if self._scrapes is not None else None
        if not pending and not lessons and load is None and scraped is None:
            return
        entries: list[Mapping[Any, Any]] = [
            {"r": self.replica_id, "b": backend, "t": f"{recorded_s:.3f}",
             "h": pack_hashes(hashes)} for hashes, backend, recorded_s in pending]
        entries += [lesson_fields(self.replica_id, lesson) for lesson in lessons]
        if load is not None:
            entries.append(load)
        if scraped is not None:
            entries.append(scraped)  # lost if the flush fails: the figures age, are read again
        maxlen = self._stream_maxlen
        try:
            # One transaction, so a blocked reader gets every entry in one reply: after each
            # command of a plain pipeline Redis answers the readers blocked on the stream, which
            # then come back for the rest (a dispatch's claim and counts: two wake-ups).
            if self._writer is not None:
                await self._writer.transaction([xadd_command(f, maxlen) for f in entries])
            else:
                # A cluster client takes no transaction; the stream is one key, one slot.
                def add_entries(pipe: Any) -> None:
                    for fields in entries:
                        pipe.xadd(APPROX_STREAM, dict(fields), maxlen=maxlen, approximate=True)

                await pipelined(self._redis, add_entries, transaction=len(entries) > 1)
        except BaseException:
            self._pending[:0] = pending
            self._lessons[:0] = lessons
            self._changed.set()  # the writer, which may not be waiting on this flush, retries
            raise

    async def run(self) -> None:
        """Until cancelled: publish local decisions, merge the other replicas'."""
        address = self._address
        reader = None if address is None else RespConnection(address, timeout_s=RESP_TIMEOUT_S)
        if address is not None and self._push_interval_s is not None:
            self._writer = RespConnection(address, timeout_s=RESP_TIMEOUT_S)
        # No await in an except or finally block of a compiled module
        # (tests/routing/test_native.py): the connections close after the ``try``.
        stopped: BaseException | None = None
        try:
            await self._run(reader)
        except BaseException as exc:
            stopped = exc
        await self._close(reader)
        if stopped is not None:
            raise stopped

    async def _close(self, reader: RespConnection | None) -> None:
        self._cancel_lazy()
        writer, self._writer = self._writer, None
        for conn in (reader, writer):
            if conn is not None:
                await conn.aclose()

    async def _run(self, reader: RespConnection | None) -> None:
        if self._push_interval_s is None:
            if reader is not None:  # one connection: the flushes and the reads take turns
                self._writer = reader
            await self._read_loop(reader, flush=True)
            return
        tasks = {asyncio.create_task(self._write_loop(), name="approx-index-sync-writer"),
                 asyncio.create_task(self._read_loop(reader, flush=False),
                                     name="approx-index-sync-reader")}
        stopped: BaseException | None = None
        try:
            # Each loop outlives Redis errors; anything else ends both and is raised here.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        except BaseException as exc:
            stopped = exc
        await _end(tasks)
        if stopped is not None:
            raise stopped

    async def _write_loop(self) -> None:
        """Flush when something changed (or every ``flush_interval_s``, for the counts'
        keepalive), at most once per ``push_interval_s``. On its own connection the writer
        does not wait for a flush's reply before the next (replies come in order; at most
        ``MAX_UNANSWERED`` on their way): a dispatch made while the last flush travels goes out
        ``push_interval_s`` after it, not a round trip and that later. Through redis-py
        (a cluster client: its pipelines may take different connections, and land out of
        order) it waits for each reply. A replica that hears no other flushes every
        ``flush_interval_s`` instead: nobody waits for its changes, and fewer, fuller
        pipelines cost it and Redis less."""
        assert self._push_interval_s is not None
        unanswered: deque[asyncio.Future[None]] = deque()
        try:
            while True:
                raise_if_cancelled()
                if self._peers is not None and not self._peers.num_peers:
                    await asyncio.sleep(self._flush_interval_s)
                else:
                    with contextlib.suppress(TimeoutError):  # the counts' keepalive may be due
                        await asyncio.wait_for(self._changed.wait(), self._flush_interval_s)
                self._changed.clear()
                self._cancel_lazy()  # this flush carries the lazy changes
                limit = MAX_UNANSWERED if self._writer is not None else 1
                error = _settle(unanswered)
                if error is None:
                    unanswered.append(asyncio.ensure_future(self.flush()))
                    while error is None and len(unanswered) >= limit:  # the oldest's reply
                        await asyncio.wait([unanswered[0]])
                        error = _settle(unanswered)
                if error is not None:
                    # Each flush that failed put its entries back: the next one sends them.
                    raise_if_cancelled()
                    log.warning("approximate index sync: %s", error)
                    await asyncio.sleep(1.0)
                    self._changed.set()  # then send them, whether or not anything changed
                    continue
                # The flush's task writes before the writer wakes again.
                await asyncio.sleep(self._push_interval_s)
        finally:
            for flush in unanswered:
                if flush.done() and not flush.cancelled():
                    flush.exception()  # retrieved: an outage during shutdown is not warned of
                else:
                    flush.cancel()

    async def _read_loop(self, reader: RespConnection | None, *, flush: bool) -> None:
        block_ms = int(self._flush_interval_s * 1000)
        while True:
            raise_if_cancelled()
            is_away = False
            try:
                if flush:
                    await self.flush()
                replies: Any
                if reader is not None:
                    replies = await reader.xread({APPROX_STREAM: self._last_id}, count=10_000,
                                                 block_ms=block_ms)
                else:
                    replies = await self._redis.xread({APPROX_STREAM: self._last_id},
                                                      count=10_000, block=block_ms)
                for _, entries in replies or []:
                    self._merge(entries)
                    if entries:
                        self._last_id = entries[-1][0]
                if self._peers is not None:
                    self._peers.apply()
            except REDIS_ERRORS as exc:
                raise_if_cancelled()
                log.warning("approximate index sync: %s", exc)
                is_away = True
            if is_away:  # not in the handler: no await in an except block, compiled
                await asyncio.sleep(1.0)

    def _merge(self, entries: Any) -> None:
        own = self.replica_id.encode()
        claims: list[tuple[int, str, float]] = []
        peers = self._peers
        for _, fields in entries:
            if fields.get(b"r") == own:
                continue  # already in the local index
            load = load_of(fields)
            if load is not None:  # a replica's requests in flight, not a claim
                if peers is not None:
                    peers.merge(fields.get(b"r", b""), load[0], is_delta=load[1])
                continue
            if SCRAPE_FIELD in fields:  # a replica's scrape of the listed engines
                if self._scrapes is not None:
                    self._scrapes.merge(fields.get(b"r", b""), fields[SCRAPE_FIELD])
                continue
            if b"o" in fields:  # a lesson, not a claim
                lesson = lesson_of(fields)
                if lesson is not None:
                    self._index.observe(*lesson)
                continue
            try:
                backend = fields[b"b"].decode()
                recorded_s = float(fields[b"t"])
                hashes = unpack_hashes(fields[b"h"])
            except (KeyError, ValueError, AttributeError, TypeError, struct.error):
                self.num_malformed += 1  # not a claim this version can read: skipped
                continue
            claims.extend((h, backend, recorded_s) for h in hashes)
        if claims:
            self._index.merge(claims, now_s=time.time())
            self.num_merged += len(claims)
