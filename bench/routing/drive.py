"""Drive one workload through a running fleet and keep what the figures need.

Open loop (Poisson arrivals at a fixed rate) or closed loop (fixed concurrency), through
``bench.run`` 's driver and client; the client also keeps the messages each request really
sent (a multi-turn request carries the engine's earlier answers), which the ideal cache
figure needs. Each worker's counters, and the gateway's routing counters, are read before and
after. Example::

    load = Load(rate_per_s=20.0, send_s=40.0, seed=1)
    run = drive(fleet, specs, load)   # records, messages, counter deltas
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import aiohttp
import uvloop

from bench.routing.fleet import RoutingFleet, scrape_gateway, scrape_workers
from bench.run.arrivals import sweep
from bench.run.client import Client, open_session
from bench.run.driver import DriveLimits, Driver, Scheduled
from bench.run.spec import Message, Record, RequestSpec, TenantSpec
from bench.run.summary import run_window_s
from bench.run.tenants import origin_of, provision


@dataclass(frozen=True, slots=True)
class Load:
    """How to send: open loop at ``rate_per_s``, or closed loop with ``concurrency`` in flight;
    new requests for ``send_s`` seconds, then up to ``drain_s`` for the last to finish."""

    rate_per_s: float | None = None
    concurrency: int | None = None
    send_s: float = 40.0
    drain_s: float = 20.0
    seed: int = 1


@dataclass(frozen=True, slots=True)
class DriveResult:
    """Every request's record, the messages it sent, and each worker's counter deltas."""

    records: list[Record]
    messages: dict[int, tuple[Message, ...]]
    counters: dict[str, dict[str, float]]  # worker name -> counter -> delta over the run
    routed: dict[str, float]  # the gateway's routing counters (`scrape_gateway`), deltas
    window_s: float  # from the first send to the last response


class _KeepingClient(Client):
    """A `Client` that keeps the messages of each request it sends, by request index."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str) -> None:
        super().__init__(session, base_url, model)
        self.messages: dict[int, tuple[Message, ...]] = {}

    def body(self, spec: RequestSpec, messages: Sequence[Message]) -> bytes:
        self.messages[spec.index] = tuple(messages)
        return super().body(spec, messages)


def make_tenants(fleet: RoutingFleet, num_tenants: int) -> list[TenantSpec]:
    """``num_tenants`` standard-tier tenants, each with a fresh key, made through the admin API."""
    tenants = [TenantSpec(f"bench-standard-{i}", "standard") for i in range(num_tenants)]
    return provision(tenants, origin_of(fleet.url), fleet.admin_token)


def _schedule(specs: Iterator[RequestSpec], load: Load) -> Iterator[Scheduled]:
    if load.rate_per_s is None:
        return ((0.0, 0, spec) for spec in specs)
    rng = random.Random(f"{load.seed}:arrivals")
    arrivals = sweep([load.rate_per_s], load.send_s, "poisson", 1.0, rng)
    return ((a.at_s, a.phase, spec) for a, spec in zip(arrivals, specs, strict=False))


async def _run(fleet: RoutingFleet, specs: Iterator[RequestSpec], load: Load
               ) -> tuple[list[Record], dict[int, tuple[Message, ...]]]:
    is_open = load.rate_per_s is not None
    limits = DriveLimits(mode="open" if is_open else "closed",
                         concurrency=None if is_open else load.concurrency,
                         max_requests=1_000_000, send_window_s=load.send_s,
                         deadline_s=load.send_s + load.drain_s)
    async with open_session(limits.concurrency) as session:
        client = _KeepingClient(session, fleet.url, fleet.model)
        records = await Driver(client, limits).run(_schedule(specs, load))
        return records, client.messages


def drive(fleet: RoutingFleet, specs: Iterator[RequestSpec], load: Load) -> DriveResult:
    """Send ``specs`` as ``load`` says; blocks until the run is over."""
    if (load.rate_per_s is None) == (load.concurrency is None):
        raise ValueError("a load is either open (rate_per_s) or closed (concurrency)")
    before, gateway_before = scrape_workers(fleet.worker_urls), scrape_gateway(fleet)
    records, messages = uvloop.run(_run(fleet, specs, load))
    after, gateway_after = scrape_workers(fleet.worker_urls), scrape_gateway(fleet)
    deltas = {name: {key: after[name][key] - before[name][key] for key in after[name]}
              for name in after}
    routed = {key: gateway_after[key] - gateway_before[key] for key in gateway_after}
    return DriveResult(records, messages, deltas, routed, run_window_s(records))
