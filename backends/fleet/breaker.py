"""A circuit breaker per backend: outlier ejection from what real requests met.

Health probes ask a backend whether it is up; the breaker watches what it does with requests.
It trips (the backend is ejected: routing skips it) on

- ``consecutive_failures`` failures in a row;
- an error rate of ``error_rate`` or more over the last ``window_s``, once that window holds
  ``min_requests`` results;
- a latency outlier (``BackendRegistry`` compares the backends: a median time to first byte
  ``latency_factor`` times the others' and at least ``latency_min_s``).

A failure is a connection that failed, a timeout, a 5xx, a response or stream broken off; a
4xx is the client's and counts as a success. An ejection lasts ``ejection_s``, doubled for
each ejection in a row up to ``max_ejection_s``; then the breaker is half-open: one request
goes through as a probe, and its result closes the breaker or ejects the backend again, for
longer. ``BackendRegistry`` never ejects more than ``max_ejected_share`` of a model's
backends, so a fault everywhere (a bad deploy, the gateway's own network) is not made worse by
ejecting the whole fleet.

Example::

    breaker = Breaker(BreakerConfig())
    if breaker.admits(now_s):
        breaker.sent()
        ...
        breaker.failed(now_s, "http_500")   # or breaker.succeeded(now_s, first_byte_s)
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Literal

State = Literal["closed", "open", "half_open"]
MAX_RESULTS = 10_000  # the window's results, whatever the request rate


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    enabled: bool = True
    consecutive_failures: int = 5
    error_rate: float = 0.5
    min_requests: int = 20
    window_s: float = 10.0
    ejection_s: float = 5.0
    max_ejection_s: float = 60.0
    max_ejected_share: float = 0.5
    latency_factor: float = 10.0  # 0: no latency outliers
    latency_min_s: float = 1.0
    latency_samples: int = 50


class Breaker:
    def __init__(self, config: BreakerConfig | None = None) -> None:
        self.config = config or BreakerConfig()
        self.state: State = "closed"
        self.reason = ""
        self.opened_until_s = 0.0
        self.num_ejections = 0  # in a row: the next ejection lasts 2**num_ejections longer
        self.num_ejections_total = 0
        self.num_consecutive_failures = 0
        self.is_probe_in_flight = False
        self._results: deque[tuple[float, bool]] = deque()
        self._num_failed_in_window = 0
        self.latencies: deque[float] = deque(maxlen=self.config.latency_samples)

    def admits(self, now_s: float) -> bool:
        """Whether routing may send a request now: closed, or half-open with no probe out."""
        if self.state == "closed":
            return True
        if self.state == "open":
            if now_s < self.opened_until_s:
                return False
            self.state = "half_open"
            self.is_probe_in_flight = False
        return not self.is_probe_in_flight

    def sent(self) -> None:
        if self.state == "half_open":
            self.is_probe_in_flight = True

    def settled(self) -> None:
        """A request ended; a half-open probe that came to no verdict (the client left) lets
        the next request probe."""
        self.is_probe_in_flight = False

    def succeeded(self, now_s: float, first_byte_s: float | None = None) -> None:
        if self.state == "half_open":
            self._close()
        elif self.state == "open":
            return  # a request sent before the ejection: no verdict on the backend now
        self.num_consecutive_failures = 0
        self._record(now_s, ok=True)
        if first_byte_s is not None:
            self.latencies.append(first_byte_s)

    def failed(self, now_s: float, reason: str) -> bool:
        """Record a failure; True when the breaker wants to eject the backend (the registry
        decides: see ``BackendRegistry.request_failed``)."""
        if self.state == "open":
            return False
        if self.state == "half_open":
            self.reason = f"half-open probe failed: {reason}"
            return True
        self.num_consecutive_failures += 1
        self._record(now_s, ok=False)
        config = self.config
        if self.num_consecutive_failures >= config.consecutive_failures:
            self.reason = f"{self.num_consecutive_failures} failures in a row (last: {reason})"
            return True
        num_results = len(self._results)
        if num_results >= config.min_requests and \
                self._num_failed_in_window >= config.error_rate * num_results:
            self.reason = (f"{self._num_failed_in_window} of the last {num_results} requests "
                           f"failed within {config.window_s:g} s (last: {reason})")
            return True
        return False

    def eject(self, now_s: float, reason: str | None = None) -> float:
        """Open the breaker; returns how long for."""
        config = self.config
        duration_s = min(config.max_ejection_s, config.ejection_s * 2.0 ** self.num_ejections)
        self.state = "open"
        self.opened_until_s = now_s + duration_s
        self.num_ejections += 1
        self.num_ejections_total += 1
        self.is_probe_in_flight = False
        if reason is not None:
            self.reason = reason
        self._results.clear()
        self._num_failed_in_window = 0
        self.latencies.clear()
        return duration_s

    def median_latency_s(self) -> float | None:
        if len(self.latencies) < min(self.config.min_requests, self.config.latency_samples):
            return None
        return float(statistics.median(self.latencies))

    def _close(self) -> None:
        self.state = "closed"
        self.reason = ""
        self.num_ejections = 0
        self.num_consecutive_failures = 0
        self.is_probe_in_flight = False

    def _record(self, now_s: float, *, ok: bool) -> None:
        results = self._results
        results.append((now_s, ok))
        if not ok:
            self._num_failed_in_window += 1
        horizon_s = now_s - self.config.window_s
        while results and (results[0][0] < horizon_s or len(results) > MAX_RESULTS):
            _, was_ok = results.popleft()
            if not was_ok:
                self._num_failed_in_window -= 1
