"""Gateway replicas share their ``/metrics`` scrapes of the listed engines, so an engine answers
about one scrape per interval however many replicas route to it.

Alone, each replica scrapes every listed engine every ``scrape_interval_s``
(``backends.fleet.sync``): with N replicas an engine renders its whole ``/metrics`` page N times
an interval (a vLLM API server does that in the process that also tokenizes and streams, and
its page grows with every histogram it keeps). With sharing, a replica scrapes an engine only
when no figures for it, its own or another replica's, are younger than ``fresh_s`` (0.9 of the
interval), and sends what it read on ``sy:approx``, the stream every replica already reads
(``backends.fleet.approx_sync``); the others take the figures as if they had read them, as of
when the entry reached them.

Who scrapes: no lease and no election, the first replica whose scrape tick finds the figures
old. The ticks of the others, which come later in the interval, find them fresh and skip. If
that replica stops, is cut off from Redis or cannot reach the engine, no figures come, they
age, and the next replica's tick past ``fresh_s`` scrapes the engine itself: the figures are
never older than about ``fresh_s`` plus one interval. Two replicas whose ticks fall within a
round trip of each other both scrape; that costs the engine one page more, nothing else.
Freshness is judged on this replica's own clock (when an entry arrived), never on another
machine's, so clock skew between replicas changes nothing. A replica still scrapes each engine
itself once (at start, and after a reload lists a new one): the page also carries the engine's
cache configuration (``backends.fleet.profiles.parse_vllm_cache_config``), which the shared
figures do not.

It is off by default (``routing.share_scrapes``): every replica's view of an engine then
changes at the same moment, and in the virtual-time simulator a worker that just looked lighter
drew requests from all of them at once (TTFT p99 +1-2 % at 512 workers x 8 replicas,
``docs/benchmarks/vsim.md``); it is for fleets whose engines feel N replicas' scrapes.

Health probes are not shared: whether a replica can reach an engine is its own question
(``backends.fleet.health``).

Wire: field ``m``, a JSON object, backend name -> ``[running, waiting, KV usage]``, or ``null``
for an engine that answered with no load figures (its load is then the gateways' books); with
``b`` "", ``t`` and ``h`` empty as the other entries that are not claims, so a replica of an
earlier version reads one as a claim on nothing.

Example::

    scrapes = ScrapeShare("gw-1", fresh_s=0.9)
    scrapes.is_due("vllm-0")                 # True: nobody's figures yet
    scrapes.scraped("vllm-0", (3, 0, 0.41))  # read here; goes out with the next flush
    fields = scrapes.entry()                 # to XADD, or None when nothing was read
    scrapes.merge(b"gw-2", fields["m"])      # another replica's: on_figures per backend
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

SCRAPE_FIELD = b"m"
Figures = tuple[int, int, float]  # running, waiting, KV usage (0..1)
# A backend's figures as heard: None when its engine answers with no load figures.
HeardFigures = Figures | None
FRESH_SHARE = 0.9  # fresh_s as a share of the scrape interval


def _figures(row: Any) -> HeardFigures:
    """A row of the wire object, checked: ``ValueError`` / ``TypeError`` when malformed."""
    if row is None:
        return None
    if not isinstance(row, list) or len(row) < 3:
        raise ValueError("a row of figures is [running, waiting, kv usage]")
    running, waiting, kv_usage = int(row[0]), int(row[1]), float(row[2])
    if running < 0 or waiting < 0 or not 0.0 <= kv_usage <= 1.0:
        raise ValueError("figures out of range")
    return running, waiting, kv_usage


class ScrapeShare:
    def __init__(self, replica_id: str, *, fresh_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.replica_id = replica_id
        self.fresh_s = fresh_s
        self.clock = clock  # monotonic seconds (the virtual-time simulator sets its own)
        self._heard_s: dict[str, float] = {}  # backend -> when figures were last read or heard
        self._pending: dict[str, HeardFigures] = {}  # read here, not sent yet
        # Called with (backend, figures, when heard) for each backend of another replica's
        # entry: FleetSync applies them as its own scrape's.
        self.on_figures: Callable[[str, HeardFigures, float], None] | None = None
        # Called once a scrape round queued figures: the sync's writer flushes them soon.
        self.on_queued: Callable[[], None] | None = None
        self.num_heard = 0  # backends' figures taken from other replicas
        self.num_malformed = 0  # entries whose figures could not be read: ignored

    def is_due(self, backend: str, now_s: float | None = None) -> bool:
        """Whether this replica should scrape ``backend`` now: no figures for it, read here or
        heard, are younger than ``fresh_s``."""
        heard_s = self._heard_s.get(backend)
        now_s = self.clock() if now_s is None else now_s
        return heard_s is None or now_s - heard_s >= self.fresh_s

    def scraped(self, backend: str, figures: HeardFigures, now_s: float | None = None) -> None:
        """This replica read ``backend``'s figures: fresh here, and queued for the others."""
        self._heard_s[backend] = self.clock() if now_s is None else now_s
        self._pending[backend] = figures

    def queued(self) -> None:
        """A scrape round is over: what it read goes out with the next flush (``on_queued``)."""
        if self._pending and self.on_queued is not None:
            self.on_queued()

    def entry(self) -> dict[Any, Any] | None:
        """The stream entry of what was read here since the last one, taken; None when
        nothing was."""
        if not self._pending:
            return None
        pending, self._pending = self._pending, {}
        return {"r": self.replica_id, "b": "", "t": f"{time.time():.3f}", "h": b"",
                SCRAPE_FIELD.decode(): orjson.dumps(pending)}

    def merge(self, replica: bytes | str, payload: bytes | str,
              now_s: float | None = None) -> None:
        """Another replica's figures: each backend's go to ``on_figures`` and count as fresh
        here. A malformed entry is counted and ignored whole."""
        name = replica.decode() if isinstance(replica, bytes) else replica
        if name == self.replica_id:
            return
        try:
            raw = orjson.loads(payload)
            if not isinstance(raw, dict):
                raise ValueError("not an object")
            rows = {str(backend): _figures(row) for backend, row in raw.items()}
        except (orjson.JSONDecodeError, TypeError, ValueError):
            self.num_malformed += 1
            return
        now_s = self.clock() if now_s is None else now_s
        for backend, figures in rows.items():
            self._heard_s[backend] = now_s
            self.num_heard += 1
            if self.on_figures is not None:
                self.on_figures(backend, figures, now_s)
