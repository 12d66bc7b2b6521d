"""Streams this gateway saw end, so a heartbeat older than them does not hide their slots.

A worker says how many requests it runs in a heartbeat (every 0.5 s in the benchmarks) that
the gateway reads from Redis on its own poll (every 0.25 s). The registry subtracts the
requests this gateway saw finish since its last *poll*, but a poll that reads the same, older
heartbeat again starts that count from zero: for up to a heartbeat interval, a slot freed by a
finished stream looks busy again. A slot kept free for interactive traffic is exactly such a
slot, so the reserve was often invisible to the request it was kept for, and a lower tier saw
one slot fewer than there was.

``RecentFinishes`` keeps, per backend, when this gateway saw its streams end, and
``correct`` subtracts from each backend's reported running count the ends seen after that
report was *made* (``now_s - age_s``), never raising what the snapshot already says. It is
worked out again for a backend only when its state or its ends changed (a snapshot keeps a
backend's state object until one of its figures does), so a request costs a lookup per
backend. Ends of other gateways' requests are not seen: with several replicas this corrects
only for one's own.

Example::

    finishes = RecentFinishes()
    finishes.record("w0", now_s)                       # a stream on w0 ended
    snapshot = finishes.correct(snapshot, {"w0": 4}.get)   # heartbeat older: 3 running
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import replace

from routing.types import BackendState, FleetSnapshot

# A worker ends a stream a moment before the gateway sees it; a heartbeat made within that
# moment already counts it, and subtracting it again would show a slot that is not free.
_SEEN_AFTER_MARGIN_S = 0.02


class RecentFinishes:
    """When this gateway saw streams end, per backend, for the last ``keep_s`` seconds."""

    MAX_CACHED = 65_536  # corrected states kept (one per backend name)

    def __init__(self, keep_s: float = 5.0) -> None:
        self.keep_s = keep_s
        self._ends: dict[str, list[float]] = {}  # ascending: recorded as they happen
        # Per backend: the state last corrected, the number of ends recorded then, and its
        # correction. A snapshot reuses a backend's state object until one of its figures
        # changes (``Backend.state``), so the correction is worked out again only when the
        # state or the ends changed: per finish and per heartbeat, not per request.
        self._corrected: dict[str, tuple[BackendState, int, BackendState]] = {}
        self._num_recorded: dict[str, int] = {}
        self.num_worked_out = 0  # corrections not answered from the cache (for tests)

    def record(self, backend: str, now_s: float) -> None:
        self._num_recorded[backend] = self._num_recorded.get(backend, 0) + 1
        ends = self._ends.setdefault(backend, [])
        if ends and now_s < ends[-1]:
            now_s = ends[-1]  # keep the list sorted whatever the caller's clock did
        ends.append(now_s)
        if ends[0] < now_s - 2 * self.keep_s:  # trim in batches: amortised O(1) per end
            del ends[:bisect_left(ends, now_s - self.keep_s)]

    def num_after(self, backend: str, since_s: float) -> int:
        ends = self._ends.get(backend)
        if not ends or ends[-1] <= since_s:
            return 0
        return len(ends) - bisect_right(ends, since_s)

    def correct(self, snapshot: FleetSnapshot,
                reported_running: Callable[[str], int | None]) -> FleetSnapshot:
        """``snapshot`` with each backend's running count less the ends seen after its report.

        ``reported_running(name)``: the running count as the backend reported it (before any
        gateway-side adjustment), or None to leave that backend as it is. Looked up only for
        the snapshot's backends, and only when there are ends to subtract."""
        if not self._ends:
            return snapshot
        backends = list(snapshot.backends)
        changed = False
        cached_get, num_recorded = self._corrected.get, self._num_recorded
        for i, b in enumerate(backends):
            if b.num_running == 0:
                continue
            name = b.name
            version = num_recorded.get(name, 0)
            cached = cached_get(name)
            if cached is not None and cached[0] is b and cached[1] == version:
                corrected = cached[2]
            else:
                corrected = self._corrected_state(b, snapshot.now_s, reported_running(name))
                if len(self._corrected) >= self.MAX_CACHED:
                    self._corrected.clear()
                self._corrected[name] = (b, version, corrected)
            if corrected is not b:
                backends[i] = corrected
                changed = True
        return replace(snapshot, backends=tuple(backends)) if changed else snapshot

    def _corrected_state(self, b: BackendState, now_s: float, reported: int | None
                         ) -> BackendState:
        self.num_worked_out += 1
        if reported is None:
            return b
        running = max(0, reported - self.num_after(b.name, now_s - b.age_s + _SEEN_AFTER_MARGIN_S))
        return replace(b, num_running=running) if running < b.num_running else b
