"""One scenario run: the load, the watchers and the fault, on one fresh fleet.

`drive` starts the steady load (`bench.faults.load`) and the ``/admin/fleet`` watcher (and
the ``/metrics`` counter watcher a scenario asks for), hands a `Run` to the scenario, which
injects its fault, waits for what it measures and calls `Run.finish`; the figures every
scenario shares (`client_figures`) are added to its own. Example::

    figures = asyncio.run(drive(fleet, gateway, key, SCENARIOS["kill"], LoadShape(seed=1)))
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.common.procstat import busy_cpu_seconds
from bench.common.stats import percentile
from bench.faults.fleet import FaultFleet
from bench.faults.load import LoadShape, Outcome, SteadyLoad
from bench.faults.watch import CounterWatch, FleetWatch
from gateway.cli.localfleet import GatewayProc

WARMUP_S = 3.0  # steady load before the fault
MAX_LOAD_S = 60.0  # no scenario's load runs longer than this


@dataclass(slots=True)
class Run:
    fleet: FaultFleet
    gateway: GatewayProc
    api_key: str
    watch: FleetWatch
    counter: CounterWatch | None
    t0_s: float
    marks: dict[str, float] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    _stop_load: asyncio.Event = field(default_factory=asyncio.Event)
    _load_task: asyncio.Task[list[Outcome]] | None = None

    def mark(self, name: str, t_s: float | None = None) -> float:
        """Note when something happened (monotonic); the results give it from the start."""
        self.marks[name] = time.monotonic() if t_s is None else t_s
        return self.marks[name]

    async def sleep_until(self, t_s: float) -> None:
        await asyncio.sleep(max(0.0, t_s - time.monotonic()))

    async def finish(self) -> list[Outcome]:
        """Stop sending and wait for every request out to end; their outcomes."""
        self._stop_load.set()
        assert self._load_task is not None
        self.outcomes = await self._load_task
        return self.outcomes

    def since(self, t_s: float | None, start_s: float) -> float | None:
        return None if t_s is None else round(t_s - start_s, 3)


Scenario = Callable[[Run], Awaitable[dict[str, Any]]]


async def drive(fleet: FaultFleet, gateway: GatewayProc, api_key: str, scenario: Scenario,
                shape: LoadShape, counter_name: str | None = None) -> dict[str, Any]:
    log_offset = gateway.log_path.stat().st_size if gateway.log_path.exists() else 0
    busy_before_s = busy_cpu_seconds()
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector,
                                     skip_auto_headers=("User-Agent",)) as session:
        watch = FleetWatch(session, gateway.url, fleet.admin_token)
        counter = (CounterWatch(session, gateway.url, counter_name) if counter_name else None)
        stop_watch = asyncio.Event()
        watchers = [asyncio.create_task(w.run(stop_watch)) for w in (watch, counter) if w]
        await asyncio.sleep(0.2)  # a first sample of each before the load starts
        run = Run(fleet, gateway, api_key, watch, counter, time.monotonic())
        load = SteadyLoad(session, gateway.url, api_key, shape)
        run._load_task = asyncio.create_task(load.run(run._stop_load, MAX_LOAD_S))
        try:
            figures = await scenario(run)
        finally:
            if not run._stop_load.is_set():
                await run.finish()
            stop_watch.set()
            await asyncio.gather(*watchers)
    wall_s = time.monotonic() - run.t0_s
    figures.update(client_figures(run.outcomes))
    figures["marks_s"] = {name: round(t - run.t0_s, 3) for name, t in run.marks.items()}
    figures["num_fleet_samples"] = len(watch.samples)
    figures["num_poll_errors"] = watch.num_poll_errors + (counter.num_poll_errors
                                                         if counter else 0)
    figures["machine_cores_busy"] = round((busy_cpu_seconds() - busy_before_s) / wall_s, 2)
    figures["gateway_log"] = _new_lines(gateway, log_offset)
    figures["requests"] = [o.to_json(run.t0_s) for o in run.outcomes if o.kind != "ok"]
    return figures


def client_figures(outcomes: list[Outcome]) -> dict[str, Any]:
    """What the clients saw: answers by kind, failures by status and code, latency."""
    kinds = Counter(o.kind for o in outcomes)
    failed = [o for o in outcomes if o.kind == "failed"]
    latencies_s = [o.latency_s for o in outcomes if o.kind == "ok"]
    return {
        "num_requests": len(outcomes),
        "num_streams": sum(o.is_stream for o in outcomes),
        "num_ok": kinds["ok"],
        "num_failed": kinds["failed"],
        "failed_by_status": dict(Counter(str(o.status) for o in failed)),
        "failed_by_code": dict(Counter(o.code or o.detail[:60] or "-" for o in failed)),
        "num_cut_error_event": kinds["cut_error_event"],
        "num_cut_silent": kinds["cut_silent"],
        "num_client_visible_failures": len(outcomes) - kinds["ok"],
        "ok_latency_p50_s": round(percentile(latencies_s, 0.5), 4) if latencies_s else None,
        "ok_latency_p99_s": round(percentile(latencies_s, 0.99), 4) if latencies_s else None,
        "ok_latency_max_s": round(max(latencies_s), 4) if latencies_s else None,
    }


def count_status(outcomes: list[Outcome], status: int, after_s: float = 0.0,
                 code: str | None = None) -> int:
    return sum(1 for o in outcomes if o.status == status and o.sent_s >= after_s
               and (code is None or o.code == code))


def _new_lines(gateway: GatewayProc, offset: int, limit: int = 60) -> list[str]:
    try:
        with gateway.log_path.open("rb") as log:
            log.seek(offset)
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return lines[:limit] + ([f"... {len(lines) - limit} more lines"] if len(lines) > limit
                            else [])
