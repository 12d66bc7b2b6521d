"""What the gateway says while a fault runs: ``/admin/fleet`` and one ``/metrics`` counter,
polled every ``interval_s`` into timestamped samples (monotonic seconds).

Example::

    watch = FleetWatch(session, origin, admin_token)
    task = asyncio.create_task(watch.run(stop))
    t_out = await watch.wait_for(lambda s: not s.is_routable(url), after_s=t_kill, timeout_s=10)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from backends.fleet.prom import parse_samples

_KEPT = ("name", "is_healthy", "source", "load_source", "load_age_s", "last_error")


@dataclass(frozen=True, slots=True)
class FleetSample:
    """One ``GET /admin/fleet``: each listed backend's fields that matter here, by URL."""

    t_s: float
    backends: dict[str, dict[str, Any]]

    def is_listed(self, url: str) -> bool:
        return url in self.backends

    def is_routable(self, url: str) -> bool:
        """Listed, healthy and its breaker not open: routing may pick it."""
        backend = self.backends.get(url)
        return bool(backend and backend["is_healthy"] and backend["breaker"]["state"] != "open")

    def breaker_state(self, url: str) -> str | None:
        backend = self.backends.get(url)
        return None if backend is None else str(backend["breaker"]["state"])

    def heartbeat_after(self, url: str, t_s: float) -> bool:
        """Listed, healthy, and its load was observed after ``t_s``."""
        backend = self.backends.get(url)
        if not backend or not backend["is_healthy"] or backend["load_age_s"] is None:
            return False
        return self.t_s - float(backend["load_age_s"]) > t_s


class _Poller:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.num_poll_errors = 0
        self._changed = asyncio.Event()

    async def poll_once(self) -> None:
        raise NotImplementedError

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.poll_once()
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError):
                self.num_poll_errors += 1
            self._changed.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)


class FleetWatch(_Poller):
    def __init__(self, session: aiohttp.ClientSession, origin: str, admin_token: str,
                 interval_s: float = 0.05) -> None:
        super().__init__(interval_s)
        self._session = session
        self._url = origin + "/admin/fleet"
        self._headers = {"Authorization": f"Bearer {admin_token}"}
        self.samples: list[FleetSample] = []

    async def poll_once(self) -> None:
        async with self._session.get(self._url, headers=self._headers,
                                     timeout=aiohttp.ClientTimeout(total=2)) as resp:
            resp.raise_for_status()
            doc = await resp.json()
        backends = {b["url"]: {**{k: b.get(k) for k in _KEPT}, "breaker": b["breaker"]}
                    for b in doc["data"]}
        self.samples.append(FleetSample(time.monotonic(), backends))

    async def wait_for(self, predicate: Callable[[FleetSample], bool], after_s: float,
                       timeout_s: float) -> float | None:
        """The time of the first sample taken after ``after_s`` for which ``predicate`` holds;
        None if none within ``timeout_s``."""
        deadline_s = after_s + timeout_s
        seen = 0
        while True:
            for sample in self.samples[seen:]:
                if sample.t_s > after_s and predicate(sample):
                    return sample.t_s
            seen = len(self.samples)
            if time.monotonic() > deadline_s:
                return None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 1.0)

    def first(self, predicate: Callable[[FleetSample], bool], after_s: float) -> float | None:
        """The time of the first sample so far after ``after_s`` for which ``predicate``
        holds."""
        return next((s.t_s for s in self.samples if s.t_s > after_s and predicate(s)), None)

    def between(self, start_s: float, end_s: float) -> list[FleetSample]:
        return [s for s in self.samples if start_s <= s.t_s <= end_s]


def count_returns(samples: list[FleetSample], url: str) -> int:
    """How many times ``url`` went from out of the routing set back into it."""
    returns = 0
    was_in = samples[0].is_routable(url) if samples else False
    for sample in samples[1:]:
        is_in = sample.is_routable(url)
        returns += is_in and not was_in
        was_in = is_in
    return returns


class CounterWatch(_Poller):
    """One counter of the gateway's ``/metrics`` page: (time, value) samples."""

    def __init__(self, session: aiohttp.ClientSession, origin: str, name: str,
                 interval_s: float = 0.05) -> None:
        super().__init__(interval_s)
        self._session = session
        self._url = origin + "/metrics"
        self.name = name
        self.samples: list[tuple[float, float]] = []

    async def poll_once(self) -> None:
        async with self._session.get(self._url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            text = await resp.text()
        self.samples.append((time.monotonic(), float(parse_samples(text).get(self.name, 0.0))))

    def last_increase_after(self, t_s: float) -> float | None:
        """The time of the last sample after ``t_s`` at which the value had grown since the
        sample before it; None when it never grew after ``t_s``."""
        last = None
        for (_, before), (now_s, value) in zip(self.samples, self.samples[1:], strict=False):
            if now_s > t_s and value > before:
                last = now_s
        return last

    def value_at(self, t_s: float) -> float:
        values = [value for when, value in self.samples if when <= t_s]
        return values[-1] if values else 0.0
