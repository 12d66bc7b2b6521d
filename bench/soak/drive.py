"""The soak's open loop: requests at a fixed rate, and the watched processes' RSS every few
seconds, until the run's duration or its request count is reached.

Arrivals are evenly spaced at ``rate_per_s``; at most ``max_in_flight`` requests are out at once
(beyond that the next one waits, so a stalled gateway slows the loop instead of piling up
sockets, and the achieved rate says so). RSS is sampled from t = 0 to t = ``duration_s``
whether or not requests are still being sent. ``checkpoints_s`` call ``on_checkpoint(label)``
(in a thread) at those times, e.g. to have a traced gateway take a tracemalloc snapshot.
With ``metrics_url``, each sample also reads the gateway's cache gauges (``CACHE_GAUGES``), so
the run shows when its per-prompt caches reached their bounds.
Example::

    plan = DrivePlan(rate_per_s=50, duration_s=600)
    result = uvloop.run(drive(url, key, UniquePrompts(shape, model, 1).body, plan,
                              watch={"gateway": pid}))
    result.samples[-1].rss_kib["gateway"]
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.common.stats import percentile
from bench.soak.rss import rss_kib

Bodies = Callable[[int], tuple[bytes, bool]]
_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)
_NUMBER = re.compile(rb"\d+(\.\d+)?")
# The gateway's per-prompt caches, as its /metrics reports them (gateway/app.py).
CACHE_GAUGES = ("switchyard_router_segment_cache_bytes", "switchyard_router_approx_index_blocks")
_GAUGE_LINE = re.compile(rb"^(" + b"|".join(g.encode() for g in CACHE_GAUGES)
                         + rb")(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class DrivePlan:
    """How hard and how long: ``max_requests`` defaults to ``rate_per_s * duration_s``."""

    rate_per_s: float = 50.0
    duration_s: float = 600.0
    max_requests: int | None = None
    sample_every_s: float = 5.0
    max_in_flight: int = 256
    drain_s: float = 30.0
    request_timeout_s: float = 60.0
    checkpoints_s: tuple[tuple[float, str], ...] = ()

    @property
    def num_requests(self) -> int:
        if self.max_requests is not None:
            return self.max_requests
        return int(self.rate_per_s * self.duration_s)


@dataclass(frozen=True, slots=True)
class Sample:
    t_s: float
    rss_kib: dict[str, int]
    num_sent: int
    num_ok: int
    num_failed: int
    num_in_flight: int
    gauges: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class DriveResult:
    samples: list[Sample] = field(default_factory=list)
    num_sent: int = 0
    num_ok: int = 0
    num_failed: int = 0
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies_ms: list[float] = field(default_factory=list)
    send_window_s: float = 0.0
    checkpoints: dict[str, Any] = field(default_factory=dict)

    def fail(self, reason: str) -> None:
        self.num_failed += 1
        self.failures[reason] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "num_sent": self.num_sent, "num_ok": self.num_ok, "num_failed": self.num_failed,
            "failures": dict(self.failures.most_common(10)),
            "send_window_s": self.send_window_s,
            "achieved_rate_per_s": self.num_sent / self.send_window_s
            if self.send_window_s else 0.0,
            "latency_p50_ms": percentile(self.latencies_ms, 0.5),
            "latency_p99_ms": percentile(self.latencies_ms, 0.99),
            "checkpoints": self.checkpoints,
            "samples": [{"t_s": round(s.t_s, 2), "rss_kib": s.rss_kib, "num_sent": s.num_sent,
                         "num_ok": s.num_ok, "num_failed": s.num_failed,
                         "num_in_flight": s.num_in_flight, "gauges": s.gauges}
                        for s in self.samples],
        }


async def _send(session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes,
                is_stream: bool, result: DriveResult) -> None:
    sent = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            if is_stream and resp.status == 200:
                async for _ in resp.content.iter_any():
                    pass
                payload = b""
            else:
                payload = await resp.read()
            status = resp.status
    except _TRANSPORT_ERRORS as exc:
        result.fail(exc.__class__.__name__)
        return
    if status != 200:
        # Numbers (waits, counts) vary from one error to the next: count errors by kind.
        reason = _NUMBER.sub(b"N", payload[:200]).decode(errors="replace")
        result.fail(f"HTTP {status}: {reason}")
        return
    result.num_ok += 1
    result.latencies_ms.append((time.perf_counter() - sent) * 1000)


async def cache_gauges(session: aiohttp.ClientSession, metrics_url: str) -> dict[str, float]:
    """``CACHE_GAUGES`` from one scrape (summed over labels); {} when the scrape fails."""
    try:
        async with session.get(metrics_url) as resp:
            text = await resp.read() if resp.status == 200 else b""
    except _TRANSPORT_ERRORS:
        return {}
    gauges: dict[str, float] = {}
    for name, value in _GAUGE_LINE.findall(text):
        gauges[name.decode()] = gauges.get(name.decode(), 0.0) + float(value)
    return gauges


async def _sample_until(end_s: float, started: float, plan: DrivePlan, watch: dict[str, int],
                        result: DriveResult, in_flight: set[asyncio.Task[None]],
                        session: aiohttp.ClientSession, metrics_url: str | None) -> None:
    index = 0
    while True:
        due = started + index * plan.sample_every_s
        if due > started + end_s + 1e-9:
            break
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        t_s = time.perf_counter() - started
        rss = {name: rss_kib(pid) for name, pid in watch.items()}
        gauges = await cache_gauges(session, metrics_url) if metrics_url else {}
        result.samples.append(Sample(
            t_s=t_s, rss_kib=rss, num_sent=result.num_sent, num_ok=result.num_ok,
            num_failed=result.num_failed, num_in_flight=len(in_flight), gauges=gauges))
        index += 1


async def _checkpoints(started: float, plan: DrivePlan, result: DriveResult,
                       on_checkpoint: Callable[[str], Any]) -> None:
    for at_s, label in plan.checkpoints_s:
        await asyncio.sleep(max(0.0, started + at_s - time.perf_counter()))
        result.checkpoints[label] = await asyncio.to_thread(on_checkpoint, label)


async def drive(url: str, api_key: str, bodies: Bodies, plan: DrivePlan,
                watch: dict[str, int],
                on_checkpoint: Callable[[str], Any] | None = None,
                metrics_url: str | None = None) -> DriveResult:
    """Send ``plan.num_requests`` bodies (or as many as fit in ``plan.duration_s``) to ``url``
    and sample ``watch``'s RSS; waits up to ``plan.drain_s`` for the last answers."""
    result = DriveResult()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    connector = aiohttp.TCPConnector(limit=plan.max_in_flight, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=plan.request_timeout_s)
    in_flight: set[asyncio.Task[None]] = set()
    gate = asyncio.Semaphore(plan.max_in_flight)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     skip_auto_headers=("User-Agent",)) as session:
        started = time.perf_counter()
        sampler = asyncio.create_task(
            _sample_until(plan.duration_s, started, plan, watch, result, in_flight, session,
                          metrics_url))
        marks = asyncio.create_task(_checkpoints(started, plan, result, on_checkpoint)) \
            if on_checkpoint and plan.checkpoints_s else None

        async def one(body: bytes, is_stream: bool) -> None:
            try:
                await _send(session, url, headers, body, is_stream, result)
            finally:
                gate.release()

        for index in range(plan.num_requests):
            offset_s = index / plan.rate_per_s
            if offset_s >= plan.duration_s:
                break
            body, is_stream = bodies(index)
            await asyncio.sleep(max(0.0, started + offset_s - time.perf_counter()))
            await gate.acquire()
            if time.perf_counter() - started >= plan.duration_s:
                gate.release()
                break
            task = asyncio.create_task(one(body, is_stream))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            result.num_sent += 1
        result.send_window_s = time.perf_counter() - started
        await sampler
        if marks is not None:
            await marks
        if in_flight:
            _, pending = await asyncio.wait(set(in_flight), timeout=plan.drain_s)
            for task in pending:
                task.cancel()
            for _ in pending:
                result.fail("not answered within the drain")
    return result
