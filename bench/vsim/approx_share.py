"""The approximate index and the in-flight counts that gateway replicas share through Redis, in
virtual time: the stream ``sy:approx`` as ``backends/fleet/approx_sync.py``'s ``ApproxIndexSync``
runs it.

Each replica's router hands every decision to its own ``ApproxIndexSync.record`` (the live code:
the same prefix to the same backend within ``republish_s`` is not sent again). The rest is
``ApproxIndexSync.run``'s loop with Redis one round trip ``rtt_s`` away (half of it each way):

- a replica wakes when its ``XREAD`` reply arrives; it merges the other replicas' entries in it
  (``ApproxPrefixIndex.merge``, each claim with its own time, rounded to the millisecond as the
  stream's ``t`` field; a load entry to its ``PeerLoad.merge``; a lesson, what a response
  taught a replica about a backend's claim lifetime, to its ``ApproxPrefixIndex.observe``),
  sets its backends' ``peer_*`` counts (``PeerLoad.apply``), then flushes what it recorded
  since its last flush and, when its own in-flight counts changed (or a keepalive is due), a
  load entry (``PeerLoad.entry``):
  pipelined ``XADD``s, in the stream half a round trip later, acknowledged a round trip later;
  then it sends its next ``XREAD`` from the last entry it read;
- an ``XREAD`` that finds unread entries when it reaches Redis (after a flush, this replica's
  own) answers at once; one that finds none blocks until an entry is added or
  ``flush_interval_s`` (its ``block=``) has passed. So an idle replica flushes every
  ``flush_interval_s``, and busy replicas wake on each other's entries and flush every few
  round trips.

A claim (or a change of in-flight counts) thus reaches the other replicas between one round trip
and ``flush_interval_s`` plus two round trips after the decision. ``flush_interval_s`` 0: every
claim reaches the others at once, as the decision is made (an ideal shared index), and so do the
counts (``load_changed``, after each change of a replica's books).

With ``push_interval_s`` (``ApproxIndexSync``'s, not None) a writer task of its own flushes
instead: woken by each change of the replica's books (``books_changed``, the router's
``on_booked`` hook; a decision changes them too), it flushes at once, then waits
``push_interval_s`` before it may flush again, the last flush's reply still on its way
(``is_pipelined``, as the gateway's writer on its own connection; not pipelined, as through
redis-py, it waits for the reply first); the read loop only reads (an ``XREAD`` blocks until
any replica, this one included, adds an entry). A change then reaches the others within about
two round trips plus ``push_interval_s``, however busy or idle the replicas are. Without it,
a change made while every replica's ``XREAD`` blocks waits for the first of them to time out:
when the replicas go quiet together, they block together and time out together,
``flush_interval_s`` later (measured: ``docs/benchmarks/vsim.md``).

``PeerLoad`` runs as live, on the simulation's clock: every call passes ``now_s``.

Example::

    share = ApproxShare([r.router.approx_index for r in replicas], ttl_s=600.0,
                        push=lambda at_s, replica: ..., has_work=lambda: True,
                        peers=[PeerLoad(registry, "r0", clock=no_clock), ...],
                        peer_backends=[registry.backends, ...],
                        peer_changed=lambda replica, backend: ...)
    router.on_record = share.recorder(0)   # replica 0's decisions go out
    share.start(0.0)                       # every replica sends its first XREAD
    share.wake(1, now_s)                   # at each time push() asked for
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import cast

import redis.asyncio as aioredis

from backends.fleet.approx_sync import FLUSH_INTERVAL_S, ApproxIndexSync, Lesson
from backends.fleet.peer_load import PeerLoad, load_of, peer_counts
from backends.fleet.registry import Backend
from routing.index_approx import ApproxPrefixIndex

Claim = tuple[tuple[int, ...], str, float]  # (character-block chain, backend, recorded_s)


def no_clock() -> float:
    """``PeerLoad``'s clock here: the simulation passes ``now_s`` to every call."""
    raise RuntimeError("in virtual time, pass now_s")


def _sync(index: ApproxPrefixIndex, replica_id: str, ttl_s: float) -> ApproxIndexSync:
    """``ApproxIndexSync`` without Redis: ``record`` as live, ``take_pending`` hands over what
    its next ``flush`` would send."""
    return ApproxIndexSync(cast(aioredis.Redis, None), index, replica_id, ttl_s=ttl_s,
                           is_plain_resp=False)


class ApproxShare:
    """``sy:approx`` between the replicas whose indexes are given, and their ``peers`` (one
    ``PeerLoad`` each, over a registry of ``peer_backends[r]``; None: no load entries); see the
    module docstring. ``peer_changed(r, i)``: replica ``r``'s backend ``i`` has new ``peer_*``
    counts."""

    def __init__(self, indexes: Sequence[ApproxPrefixIndex], *, ttl_s: float,
                 push: Callable[[float, int], None], has_work: Callable[[], bool],
                 flush_interval_s: float = FLUSH_INTERVAL_S, rtt_s: float = 0.001,
                 peers: Sequence[PeerLoad] | None = None,
                 peer_backends: Sequence[Sequence[Backend]] = (),
                 peer_changed: Callable[[int, int], None] = lambda replica, backend: None,
                 push_interval_s: float | None = None,
                 lazy_interval_s: float = 0.0,
                 is_pipelined: bool = True,
                 ) -> None:
        if flush_interval_s < 0 or rtt_s < 0:
            raise ValueError("need flush_interval_s >= 0 and rtt_s >= 0")
        if peers is not None and not len(peers) == len(peer_backends) == len(indexes):
            raise ValueError("need one PeerLoad, and the backends of its registry, per replica")
        self.peer_backends = [list(backends) for backends in peer_backends]
        self.peers = None if peers is None else list(peers)
        self._peer_changed = peer_changed
        self.indexes = list(indexes)
        self.syncs = [_sync(index, f"r{i}", ttl_s) for i, index in enumerate(self.indexes)]
        self.flush_interval_s = flush_interval_s
        self.rtt_s = rtt_s
        self._push = push
        self._has_work = has_work
        num_replicas = len(self.indexes)
        # The stream's unread tail: when each flush's entries were added, by whom, their
        # claims, load entry (None: none) and lessons.
        self._added_s: list[float] = []
        self._entries: list[tuple[int, list[Claim], tuple[bytes, bool] | None,
                                  list[Lesson]]] = []
        self._base = 0  # the stream position of _entries[0]
        self._read = [0] * num_replicas  # stream position each replica has read up to
        self._at_redis_s = [0.0] * num_replicas  # when its pending XREAD reaches Redis
        self._wake_s = [math.inf] * num_replicas  # when that XREAD's reply arrives
        self.num_flushes = 0
        self.num_claims_sent = 0
        self.num_loads_sent = 0
        self.num_lessons_sent = 0
        # push_interval_s not None: a writer task of its own (its own connection) flushes as
        # the books change, at most once per push_interval_s (plus a round trip when not
        # is_pipelined); the read loop
        # only reads (ApproxIndexSync's push_interval_s). None: the read loop flushes.
        self.has_writer = push_interval_s is not None and flush_interval_s > 0
        self.push_interval_s = 0.0 if push_interval_s is None else push_interval_s
        # A change that only lowers the counts wakes the writer this much later, unless a
        # dispatch wakes it first (ApproxIndexSync's lazy_interval_s).
        self.lazy_interval_s = lazy_interval_s
        # The writer's next flush may go push_interval_s after the last was sent, its reply
        # still on the way; not pipelined: a round trip later as well.
        self.is_pipelined = is_pipelined
        self._num_replicas = num_replicas
        self._writer_at = [math.inf] * num_replicas  # when the writer's wake is due
        self._writer_free_s = [0.0] * num_replicas  # when its last flush's reply and sleep end

    @property
    def is_at_once(self) -> bool:
        return self.flush_interval_s == 0

    def recorder(self, replica: int) -> Callable[[tuple[int, ...], str, float], None]:
        """The ``Router.on_record`` hook of ``replica``."""
        sync = self.syncs[replica]
        if not self.is_at_once:
            return sync.record

        def record_at_once(char_hashes: tuple[int, ...], backend: str, recorded_s: float) -> None:
            sync.record(char_hashes, backend, recorded_s)
            claims = sync.take_pending()
            self.num_claims_sent += len(claims)
            for other in range(len(self.indexes)):
                if other != replica and claims:
                    self._merge(other, claims, recorded_s)

        return record_at_once

    def teacher(self, replica: int) -> Callable[[str, float, bool], None]:
        """The ``Router.on_lesson`` hook of ``replica``: its lessons go out with its next flush
        (``ApproxIndexSync.lesson``), or at once with ``flush_interval_s`` 0."""
        sync = self.syncs[replica]
        if not self.is_at_once:
            return sync.lesson

        def teach_at_once(backend: str, claim_age_s: float, is_hit: bool) -> None:
            self.num_lessons_sent += 1
            for other, index in enumerate(self.indexes):
                if other != replica:
                    index.observe(backend, claim_age_s, is_hit)

        return teach_at_once

    def start(self, now_s: float) -> None:
        """Every replica sends its first ``XREAD`` (it caught up on an empty stream)."""
        if not self.is_at_once:
            for replica in range(len(self.indexes)):
                self._send_read(replica, now_s)

    def wake(self, replica: int, now_s: float) -> None:
        """The time ``push`` asked for: ``replica``'s ``XREAD`` reply, unless a sooner one
        replaced it."""
        if replica >= self._num_replicas:
            self._writer(replica - self._num_replicas, now_s)
            return
        if now_s != self._wake_s[replica]:
            return
        half_s = self.rtt_s / 2
        start = self._read[replica] - self._base
        end = bisect_right(self._added_s, now_s - half_s, lo=start)
        self._read[replica] = self._base + end
        claims: list[Claim] = []
        peers = None if self.peers is None else self.peers[replica]
        lessons: list[Lesson] = []
        for source, entries, load, taught in self._entries[start:end]:
            if source == replica:
                continue
            claims += entries
            lessons += taught
            if load is not None and peers is not None:
                peers.merge(f"r{source}", load[0], now_s, is_delta=load[1])
        if claims:
            self._merge(replica, claims, now_s)
        index = self.indexes[replica]
        for lesson in lessons:
            index.observe(*lesson)
        if peers is not None:
            self._apply(replica, now_s)
        self._trim()
        if self.has_writer or not self._flush(replica, now_s, wake_self=False):
            self._send_read(replica, now_s)  # the writer flushes; or nothing was to be sent
            return
        self._send_read(replica, now_s + self.rtt_s)  # after the pipeline's reply

    def _flush(self, replica: int, now_s: float, *, wake_self: bool) -> bool:
        """``ApproxIndexSync.flush`` at ``now_s``: False when it had nothing to send."""
        half_s = self.rtt_s / 2
        peers = None if self.peers is None else self.peers[replica]
        pending = self.syncs[replica].take_pending()
        lessons = self.syncs[replica].take_lessons()
        entry = None if peers is None else peers.entry(now_s)
        load = None if entry is None else load_of(entry)
        if not pending and not lessons and load is None:
            return False
        self.num_flushes += 1
        self.num_claims_sent += len(pending)
        self.num_lessons_sent += len(lessons)
        self.num_loads_sent += load is not None
        added_s = now_s + half_s
        self._added_s.append(added_s)
        self._entries.append((replica, pending, load, lessons))
        for other, at_redis_s in enumerate(self._at_redis_s):
            if other == replica and not wake_self:
                continue
            reply_s = max(at_redis_s, added_s) + half_s
            if reply_s < self._wake_s[other]:
                self._wake_s[other] = reply_s
                self._push(reply_s, other)
        return True

    def _writer(self, replica: int, now_s: float) -> None:
        """The writer task (``ApproxIndexSync._write_loop``), woken by a change: flush; when
        it sent something, await the pipeline's reply (unless ``is_pipelined``), then sleep
        ``push_interval_s`` (the cap on its rate) before it may flush again."""
        if now_s != self._writer_at[replica]:
            return
        self._writer_at[replica] = math.inf
        if self._flush(replica, now_s, wake_self=True):
            reply_s = 0.0 if self.is_pipelined else self.rtt_s
            self._writer_free_s[replica] = now_s + reply_s + self.push_interval_s

    def _kick(self, replica: int, now_s: float) -> None:
        """``ApproxIndexSync.notify``: wake ``replica``'s writer at ``now_s`` (once it is
        free), unless it is to wake sooner already."""
        at_s = max(now_s, self._writer_free_s[replica])
        if at_s < self._writer_at[replica]:
            self._writer_at[replica] = at_s
            self._push(at_s, self._num_replicas + replica)

    def books_changed(self, replica: int, now_s: float, urgent: bool = True) -> None:
        """``replica``'s books changed (or it made a decision) at ``now_s``: the router's
        ``on_booked`` hook; with a writer of its own, that wakes the writer, at once when
        ``urgent`` (a dispatch), else ``lazy_interval_s`` later."""
        if self.has_writer:
            self._kick(replica, now_s if urgent else now_s + self.lazy_interval_s)

    def _send_read(self, replica: int, sent_s: float) -> None:
        half_s = self.rtt_s / 2
        at_redis_s = self._at_redis_s[replica] = sent_s + half_s
        if self._read[replica] < self._base + len(self._entries):
            reply_s = at_redis_s + half_s  # unread entries: every one was added by now
        elif self._has_work():
            reply_s = at_redis_s + self.flush_interval_s + half_s  # the block times out
        else:
            self._wake_s[replica] = math.inf  # the run is over: no more reads
            return
        self._wake_s[replica] = reply_s
        self._push(reply_s, replica)

    def load_changed(self, replica: int, now_s: float) -> None:
        """``replica``'s books changed at ``now_s``: with ``flush_interval_s`` 0, the others
        hear its counts at once (else its next flush sends them)."""
        if not self.is_at_once or self.peers is None:
            return
        entry = self.peers[replica].entry(now_s)
        if entry is None:
            return
        self.num_loads_sent += 1
        load = load_of(entry)
        assert load is not None
        for other, peers in enumerate(self.peers):
            if other != replica:
                peers.merge(f"r{replica}", load[0], now_s, is_delta=load[1])
                self._apply(other, now_s)

    def _apply(self, replica: int, now_s: float) -> None:
        """``PeerLoad.apply`` at ``now_s``; each backend whose ``peer_*`` counts it changed goes
        to ``peer_changed``."""
        assert self.peers is not None
        peers = self.peers[replica]
        backends = self.peer_backends[replica]
        before = [peer_counts(b) for b in backends]
        peers.apply(now_s)
        for i, backend in enumerate(backends):
            if before[i] != peer_counts(backend):
                self._peer_changed(replica, i)

    def _merge(self, replica: int, claims: Sequence[Claim], now_s: float) -> None:
        """As ``ApproxIndexSync._merge``: one claim per block hash, at the stream's time."""
        self.indexes[replica].merge(
            [(h, backend, round(recorded_s, 3)) for chain, backend, recorded_s in claims
             for h in chain], now_s=now_s)

    def _trim(self) -> None:
        """Drop the entries every replica has read."""
        num_read = min(self._read) - self._base
        if num_read >= 256:
            del self._added_s[:num_read]
            del self._entries[:num_read]
            self._base += num_read
