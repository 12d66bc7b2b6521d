"""Drive one workload through the front, one connection per request, and read every replica.

`bench.routing.drive` 's open loop and client, with one difference: the session closes each
connection after its response (``force_close``), so the TCP front (`bench.replicas.balancer`)
hands every request to the next replica, as nginx's round robin does; with kept-alive
connections a few busy connections would carry most requests to a few replicas. The workers'
counters are read before and after, as there, and each replica's request and routing counters
(read from the replica itself, not through the front). The driver holds its garbage collector
while it sends (`bench.common.gc_hold`). Example::

    run = drive_front(fleet, specs, Load(rate_per_s=26.0, send_s=50.0, seed=1))
    run.result.records, run.per_replica
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import httpx
import orjson
import uvloop

from backends.fleet.prom import metric_sums
from bench.common.gc_hold import held_collections
from bench.replicas.fleet import ReplicaFleet
from bench.routing.drive import DriveResult, Load, _KeepingClient, _schedule
from bench.routing.fleet import scrape_workers
from bench.run.driver import DriveLimits, Driver
from bench.run.spec import Message, Record, RequestSpec
from bench.run.summary import run_window_s

# Read from each replica before and after a run (sums over their labels).
REPLICA_COUNTERS = {"requests": ("switchyard_requests_total",),
                    "prompt_tokens": ("switchyard_routing_prompt_tokens_total",),
                    "expected_cached_tokens": ("switchyard_routing_expected_cached_tokens_total",)}


@dataclass(frozen=True, slots=True)
class FrontRun:
    """A run through the front: `bench.routing.drive` 's result (its ``routed`` summed over the
    replicas) and each replica's counter deltas."""

    result: DriveResult
    per_replica: list[dict[str, float]]


def scrape_replicas(fleet: ReplicaFleet) -> list[dict[str, float]]:
    """Each replica's `REPLICA_COUNTERS`, read from the replica itself."""
    out = []
    with httpx.Client(timeout=5) as client:
        for replica in fleet.replicas:
            text = client.get(replica.url + "/metrics").raise_for_status().text
            out.append(dict.fromkeys(REPLICA_COUNTERS, 0.0) | metric_sums(text,
                                                                          REPLICA_COUNTERS))
    return out


def open_per_request_session() -> aiohttp.ClientSession:
    """A session that opens a connection per request (no limit on how many at once)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=True),
        timeout=aiohttp.ClientTimeout(total=600), skip_auto_headers=("User-Agent",),
        json_serialize=lambda x: orjson.dumps(x).decode())


async def _run(fleet: ReplicaFleet, specs: Iterator[RequestSpec], load: Load
               ) -> tuple[list[Record], dict[int, tuple[Message, ...]]]:
    if load.rate_per_s is None:
        raise ValueError("the replicas bench drives an open loop (rate_per_s)")
    limits = DriveLimits(mode="open", concurrency=None, max_requests=1_000_000,
                         send_window_s=load.send_s, deadline_s=load.send_s + load.drain_s)
    async with open_per_request_session() as session:
        client = _KeepingClient(session, fleet.url, fleet.front.model)
        records = await Driver(client, limits).run(_schedule(specs, load))
        return records, client.messages


def _deltas(before: list[dict[str, float]], after: list[dict[str, float]]
            ) -> list[dict[str, float]]:
    return [{key: a[key] - b.get(key, 0.0) for key in a} for b, a in zip(before, after,
                                                                           strict=True)]


def drive_front(fleet: ReplicaFleet, specs: Iterator[RequestSpec], load: Load) -> FrontRun:
    """Send ``specs`` through the front as ``load`` says; blocks until the run is over."""
    workers_before, replicas_before = scrape_workers(fleet.front.worker_urls), \
        scrape_replicas(fleet)
    with held_collections():  # the driver's own GC pauses would add to the TTFTs it measures
        records, messages = uvloop.run(_run(fleet, specs, load))
    workers_after, replicas_after = scrape_workers(fleet.front.worker_urls), \
        scrape_replicas(fleet)
    counters = {name: {key: workers_after[name][key] - workers_before[name][key]
                       for key in workers_after[name]} for name in workers_after}
    per_replica = _deltas(replicas_before, replicas_after)
    routed = {key: sum(r[key] for r in per_replica)
                              for key in ("prompt_tokens", "expected_cached_tokens")}
    return FrontRun(DriveResult(records, messages, counters, routed, run_window_s(records)),
                    per_replica)
