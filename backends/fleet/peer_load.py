"""What the other gateway replicas have in flight on each backend, so every replica routes on
the whole fleet's dispatches and not on its own 1/N of them.

A replica counts the requests it sent (``Backend.num_in_flight`` and its token figures) at once,
but an engine's own figures (heartbeat or ``/metrics``) reach it only every second or so; in
between, with N replicas behind a round-robin balancer, it would see about 1/N of what was sent
to each backend, and its balance guards would act late (``docs/benchmarks/vsim.md``, "Gateway
replicas"). So each replica publishes its per-backend counts on the shared stream that carries
the approximate index (``backends.fleet.approx_sync``), every flush (100 ms) while they change and
every ``keepalive_s`` while they do not, and adds up what the others last said into each
``Backend``'s ``peer_*`` fields; ``Backend.state`` adds those to its own. A replica not heard
from for ``expire_s`` (stopped, or cut off from Redis) counts for nothing.

An entry carries the approximate index's fields too, empty (``b`` "", ``h`` no hashes), so a
replica of an earlier version reads it as a claim on nothing.

Example::

    peers = PeerLoad(registry, replica_id="gw-1")
    fields = peers.entry(now_s)          # to XADD, or None when there is nothing new to say
    peers.merge(b"gw-2", fields[b"l"], now_s)
    peers.apply(now_s)                   # Backend.peer_* = the sums of the others' counts
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from backends.fleet.registry import BackendRegistry

LOAD_FIELD = b"l"
Counts = dict[str, tuple[int, int, int]]  # backend -> (in flight, their tokens, prompt tokens)


class PeerLoad:
    def __init__(self, registry: BackendRegistry, replica_id: str, *, keepalive_s: float = 1.0,
                 expire_s: float = 3.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._registry = registry
        self.replica_id = replica_id
        self._keepalive_s = keepalive_s
        self._expire_s = expire_s
        self._clock = clock
        self._sent: Counts | None = None
        self._sent_s = float("-inf")
        self._peers: dict[str, tuple[float, Counts]] = {}  # replica -> (heard at, its counts)
        self._is_changed = False  # a count heard since the last apply
        self.num_merged = 0

    def own(self) -> Counts:
        return {b.name: (b.num_in_flight, b.num_in_flight_tokens, b.num_in_flight_prompt_tokens)
                for b in self._registry.backends if b.num_in_flight}

    def entry(self, now_s: float | None = None) -> dict[Any, Any] | None:
        """The stream entry to add now: this replica's counts, when they changed since the
        last one or ``keepalive_s`` has passed; else None."""
        now_s = self._clock() if now_s is None else now_s
        counts = self.own()
        if counts == self._sent and now_s - self._sent_s < self._keepalive_s:
            return None
        self._sent, self._sent_s = counts, now_s
        return {"r": self.replica_id, "b": "", "t": f"{time.time():.3f}", "h": b"",
                LOAD_FIELD.decode(): orjson.dumps(counts)}

    def merge(self, replica: bytes | str, payload: bytes, now_s: float | None = None) -> None:
        """Another replica's counts, as its entry said (a malformed one is ignored)."""
        name = replica.decode() if isinstance(replica, bytes) else replica
        if name == self.replica_id:
            return
        try:
            raw = orjson.loads(payload)
            counts = {str(k): (int(v[0]), int(v[1]), int(v[2])) for k, v in raw.items()}
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError, IndexError):
            return
        self._peers[name] = (self._clock() if now_s is None else now_s, counts)
        self._is_changed = True
        self.num_merged += 1

    def apply(self, now_s: float | None = None) -> None:
        """Set each backend's ``peer_*`` fields to the sums of the live replicas' counts; a
        pass over the backends only when a count was heard or a replica fell silent since."""
        now_s = self._clock() if now_s is None else now_s
        silent = [n for n, (heard_s, _) in self._peers.items() if now_s - heard_s > self._expire_s]
        for name in silent:
            del self._peers[name]
        if not (silent or self._is_changed):
            return
        self._is_changed = False
        sums: dict[str, list[int]] = {}
        for _, counts in self._peers.values():
            for name, (requests, tokens, prompt_tokens) in counts.items():
                total = sums.setdefault(name, [0, 0, 0])
                total[0] += requests
                total[1] += tokens
                total[2] += prompt_tokens
        for backend in self._registry.backends:
            requests, tokens, prompt_tokens = sums.get(backend.name, (0, 0, 0))
            if (backend.peer_in_flight, backend.peer_in_flight_tokens,
                    backend.peer_in_flight_prompt_tokens) != (requests, tokens, prompt_tokens):
                backend.peer_in_flight = requests
                backend.peer_in_flight_tokens = tokens
                backend.peer_in_flight_prompt_tokens = prompt_tokens

    @property
    def num_peers(self) -> int:
        return len(self._peers)
