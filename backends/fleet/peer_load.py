"""What the other gateway replicas have in flight on each backend, and what they saw of it
since the engine last reported, so every replica routes on the whole fleet's dispatches and not
on its own 1/N of them.

A replica counts the requests it sent (``Backend.num_in_flight`` and its token figures) at once,
but an engine's own figures (heartbeat or ``/metrics``) reach it only every second or so; in
between, with N replicas behind a round-robin balancer, it would see about 1/N of what was sent
to each backend, and its balance guards would act late (``docs/benchmarks/vsim.md``, "Gateway
replicas"). It corrects the engine's last figures by what it saw since, and with N replicas it
too sees 1/N of that: the requests that finished, those the engine counted waiting that have had
their first token, the streams on their last step.

So each replica publishes, per backend, on the shared stream that carries the approximate index
(``backends.fleet.approx_sync``, whose writer flushes within a round trip or so of a change),
as they change while another replica is listening, and every ``keepalive_s`` in any case (a
replica alone sends only that, which is how a newcomer learns of it): its requests in flight
(requests, their tokens, their prompt tokens still to prefill), its streams on their last step,
and the finishes and counted first tokens since its previous entry. Each replica adds up what
the others last said of their levels into each ``Backend``'s ``peer_*`` fields, and adds the
finishes and first tokens they told of to ``peer_finished_since_load`` /
``peer_started_since_load``, which start again from 0 at its own next observation of the
engine (as its own counts do; an entry lost on the way so skews the correction until then, no
longer). ``Backend.state`` adds all of them to its own. A replica not heard from for
``expire_s`` (stopped, or cut off from Redis) counts for nothing.

Wire: a JSON object, backend name -> ``[in flight, tokens, prompt tokens, ending, finished
since, started since]``. Between keepalives an entry carries only the rows that changed since
the replica's previous one (field ``d``; a row of zero levels: nothing there any more), so an
entry costs its readers O(what changed), not O(fleet); a keepalive carries every row (field
``l``) and replaces what the readers knew, which also rights a reader that missed an entry. A
replica of the first version sends and reads ``l`` alone, with the first three counts (the
others then count as 0). An entry carries the approximate index's fields too, empty (``b`` "",
``h`` no hashes), so a replica of an earlier version reads a ``d`` entry as a claim on
nothing.

Example::

    peers = PeerLoad(registry, replica_id="gw-1")
    fields = peers.entry(now_s)          # to XADD, or None when there is nothing new to say
    payload, is_delta = load_of(fields)
    peers.merge(b"gw-2", payload, now_s, is_delta=is_delta)
    peers.apply(now_s)                   # Backend.peer_* from the others' counts
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from backends.fleet.registry import Backend, BackendRegistry

LOAD_FIELD = b"l"  # every row: what this replica has now (readable by the first version)
DELTA_FIELD = b"d"  # the rows that changed since its previous entry
_NO_LEVELS = (0, 0, 0, 0)
# backend -> (in flight, their tokens, prompt tokens, streams ending): what a replica has now.
Levels = dict[str, tuple[int, int, int, int]]
# backend -> (finishes, counted first tokens): what a replica saw since its previous entry.
Changes = dict[str, tuple[int, int]]
_NO_CHANGE = (0, 0)


def load_of(fields: Mapping[Any, Any]) -> tuple[bytes, bool] | None:
    """An entry's counts and whether they are a delta (``PeerLoad.merge``'s arguments), from
    its fields as read from Redis (bytes keys) or as ``PeerLoad.entry`` made them; None when it
    carries none (a claim)."""
    for key, is_delta in ((LOAD_FIELD, False), (DELTA_FIELD, True)):
        value = fields.get(key)
        if value is None:
            value = fields.get(key.decode())
        if value is not None:
            return value, is_delta
    return None


def peer_counts(backend: Backend) -> tuple[int, ...]:
    """A backend's ``peer_*`` fields: what ``PeerLoad.apply`` sets."""
    return (backend.peer_in_flight, backend.peer_in_flight_tokens,
            backend.peer_in_flight_prompt_tokens, backend.peer_ending,
            backend.peer_finished_since_load, backend.peer_started_since_load)


class PeerLoad:
    def __init__(self, registry: BackendRegistry, replica_id: str, *, keepalive_s: float = 1.0,
                 expire_s: float = 3.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._registry = registry
        self.replica_id = replica_id
        self._keepalive_s = keepalive_s
        self._expire_s = expire_s
        self._clock = clock
        self._sent: Levels = {}
        self._sent_s = float("-inf")
        # Per backend, this replica's (finished, started) totals as its last entry told them.
        self._told = {b.name: (b.num_finished_total, b.num_started_total)
                      for b in registry.backends}
        self._peers: dict[str, tuple[float, Levels]] = {}  # replica -> (heard at, its levels)
        self._heard: dict[str, list[int]] = {}  # backend -> [finishes, first tokens] to apply
        self._sums: dict[str, list[int]] = {}  # backend -> the live replicas' levels, summed
        self._dirty: set[str] = set()  # backends whose sums or told changes await apply
        self.num_merged = 0

    def _own(self, *, with_changes: bool) -> tuple[Levels, Changes]:
        """This replica's levels, and (``with_changes``) the finishes and counted first tokens
        since the last entry, per backend, in one pass over the backends (the changes are
        taken: the next call counts from here)."""
        levels: Levels = {}
        changes: Changes = {}
        told = self._told
        for b in self._registry.backends:
            if b.num_in_flight:
                levels[b.name] = (b.num_in_flight, b.num_in_flight_tokens,
                                  b.num_in_flight_prompt_tokens, b.num_ending)
            totals = (b.num_finished_total, b.num_started_total)
            before = told.get(b.name, _NO_CHANGE)
            if totals != before:
                if with_changes:
                    changes[b.name] = (totals[0] - before[0], totals[1] - before[1])
                told[b.name] = totals
        return levels, changes

    def entry(self, now_s: float | None = None) -> dict[Any, Any] | None:
        """The stream entry to add now: this replica's counts, when they changed since the
        last one and another replica is listening, or when ``keepalive_s`` has passed; else
        None."""
        now_s = self._clock() if now_s is None else now_s
        is_due = now_s - self._sent_s >= self._keepalive_s
        if not self._peers:
            # No other replica heard from: nobody to tell but a newcomer, which the keepalive
            # tells this one exists (then it hears every change, as this one hears its). What
            # changed before a keepalive was told to nobody: the changes start after it.
            if not is_due:
                return None
            levels, changes = self._own(with_changes=False)
        else:
            levels, changes = self._own(with_changes=True)
            if not changes and levels == self._sent and not is_due:
                return None
        sent, self._sent = self._sent, levels
        wire: dict[str, tuple[int, ...]]
        if is_due:  # every row, now and then: a reader that missed an entry is right again
            self._sent_s = now_s
            field = LOAD_FIELD
            wire = {name: (*counts, *changes.get(name, _NO_CHANGE))
                    for name, counts in levels.items()}
        else:  # the rows that changed: O(what changed), however large the fleet
            field = DELTA_FIELD
            wire = {name: (*levels.get(name, _NO_LEVELS), *changes.get(name, _NO_CHANGE))
                    for name in levels.keys() | sent.keys()
                    if levels.get(name) != sent.get(name)}
        for name, change in changes.items():
            if name not in wire:
                wire[name] = (*levels.get(name, _NO_LEVELS), *change)
        return {"r": self.replica_id, "b": "", "t": f"{time.time():.3f}", "h": b"",
                field.decode(): orjson.dumps(wire)}

    def merge(self, replica: bytes | str, payload: bytes, now_s: float | None = None, *,
              is_delta: bool = False) -> None:
        """Another replica's counts, as its entry said: every row (``l``), or the rows that
        changed since its previous entry (``d``, ``is_delta``). A malformed one is ignored."""
        name = replica.decode() if isinstance(replica, bytes) else replica
        if name == self.replica_id:
            return
        try:
            raw = orjson.loads(payload)
            rows = {str(k): [int(x) for x in v[:6]] for k, v in raw.items()}
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            return
        if any(len(row) < 3 for row in rows.values()):
            return
        known = self._peers.get(name)
        levels: Levels = known[1] if known is not None else {}
        if not is_delta:  # every row: what it no longer lists, it no longer has
            for backend in [b for b in levels if b not in rows]:
                self._add(backend, levels.pop(backend), -1)
        for backend, row in rows.items():
            row.extend([0] * (6 - len(row)))  # a replica of the first version: levels only
            counts = (row[0], row[1], row[2], row[3])
            before = levels.get(backend, _NO_LEVELS)
            if counts != before:
                self._add(backend, before, -1)
                self._add(backend, counts, 1)
                if counts == _NO_LEVELS:
                    del levels[backend]
                else:
                    levels[backend] = counts
            if row[4] > 0 or row[5] > 0:
                heard = self._heard.setdefault(backend, [0, 0])
                heard[0] += max(0, row[4])
                heard[1] += max(0, row[5])
                self._dirty.add(backend)
        self._peers[name] = (self._clock() if now_s is None else now_s, levels)
        self.num_merged += 1

    def _add(self, backend: str, counts: tuple[int, int, int, int], sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) one replica's counts on ``backend`` from the
        sums ``apply`` sets."""
        if counts == _NO_LEVELS:
            return
        total = self._sums.setdefault(backend, [0, 0, 0, 0])
        for i in range(4):
            total[i] += sign * counts[i]
        if not any(total):
            del self._sums[backend]
        self._dirty.add(backend)

    def apply(self, now_s: float | None = None) -> None:
        """Set the ``peer_*`` fields of the backends whose counts changed since the last call
        (a replica silent for ``expire_s`` is dropped first): O(what changed), not O(fleet)."""
        now_s = self._clock() if now_s is None else now_s
        silent = [n for n, (heard_s, _) in self._peers.items() if now_s - heard_s > self._expire_s]
        for name in silent:
            for backend_name, counts in self._peers.pop(name)[1].items():
                self._add(backend_name, counts, -1)
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        heard, self._heard = self._heard, {}
        get = self._registry.get
        for name in dirty:
            backend = get(name)
            if backend is None:
                continue
            requests, tokens, prompt_tokens, ending = self._sums.get(name, _NO_LEVELS)
            if (backend.peer_in_flight, backend.peer_in_flight_tokens,
                    backend.peer_in_flight_prompt_tokens, backend.peer_ending) != (
                    requests, tokens, prompt_tokens, ending):
                backend.peer_in_flight = requests
                backend.peer_in_flight_tokens = tokens
                backend.peer_in_flight_prompt_tokens = prompt_tokens
                backend.peer_ending = ending
            news = heard.get(name)
            if news is not None:
                if news[0]:
                    backend.peer_finished_since_load += news[0]
                if news[1]:
                    backend.peer_started_since_load += news[1]
            backend.invalidate()

    @property
    def num_peers(self) -> int:
        return len(self._peers)
