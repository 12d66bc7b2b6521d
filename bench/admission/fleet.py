"""Processes of the admission benchmark: a private Redis, engines, gateways; and what they say.

``Fleet`` is a `gateway.cli.localfleet.LocalFleet` (one Redis and a `ProcessGroup`); engines
(simulated workers joining through Redis heartbeats, the same workers without Redis for a
third-party fleet (`bench.common.fleet_modes`), or a zero-delay mock engine listed in the
configuration) and gateways are started into it. Every gateway shares the admin token and key
secret, so tenants and keys made through one work through all. Example::

    with Fleet(workdir) as fleet:
        workers = fleet.start_sim(4, max_batch=4, speed_factor=0.25)
        off, on = fleet.start_gateways([False, True])
        # third-party: no heartbeats; the gateways list the engines and discover nothing else
        urls = fleet.start_sim(4, has_redis=False, max_batch=4, speed_factor=0.25)
        off, on = fleet.start_gateways([False, True], static_backends(urls, SIM_MODEL),
                                       routing={"discover_workers": False})
        keys = provision(off.url, fleet.admin_token, ["t0", "t1"], ["interactive", "batch"])
        by_label(scrape(on.url + "/metrics"), "switchyard_admission_rejections_total")
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import redis

from backends.fleet.prom import parse_samples
from gateway.cli.localfleet import (
    MOCK_MODEL,
    SIM_MODEL,
    GatewayProc,
    LocalFleet,
    admin_client,
    create_key,
    create_tenant,
)

__all__ = ["MOCK_MODEL", "SIM_MODEL", "Fleet", "GatewayProc", "provision", "scrape",
           "wait_idle"]


class Fleet(LocalFleet):
    """A private Redis and the children started around it; all stopped on exit."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, grace_s=5)
        self._num_gateways = 0

    def start_sim(self, num_workers: int, has_redis: bool = True,
                  **profile: float | int) -> list[str]:
        """Simulated workers, joining through Redis heartbeats (``has_redis``) or not a word to
        Redis (a third-party fleet); their base URLs once they answer."""
        flags = [item for name, value in profile.items()
                 for item in ("--" + name.replace("_", "-"), str(value))]
        if has_redis:
            flags += ["--heartbeat-interval-s", "0.5"]
        return self.start_sims(num_workers, has_redis=has_redis, flags=flags)

    def start_mock(self) -> dict[str, Any]:
        """One zero-delay mock engine; its backend entry for a gateway configuration."""
        [url] = self.start_mocks(["mock"])
        return {"name": "mock-0", "url": url, "models": [MOCK_MODEL]}

    def start_gateways(self, modes: Sequence[bool], backends: Sequence[Mapping[str, Any]] = (),
                       admission: Sequence[Mapping[str, Any]] = (),
                       routing: Mapping[str, Any] | None = None) -> list[GatewayProc]:
        """One gateway per entry of ``modes`` (SLO admission on or off), started together;
        ``admission`` (if given, one per gateway) adds settings to each one's ``admission``,
        ``routing`` (if given) is every gateway's ``routing``."""
        started = []
        extras = list(admission) or [{}] * len(modes)
        for slo_enabled, extra in zip(modes, extras, strict=True):
            self._num_gateways += 1
            settings: dict[str, Any] = {
                "backends": list(backends), "log_level": "warning",
                "admission": {"slo_enabled": slo_enabled, **extra},
            }
            if routing is not None:
                settings["routing"] = dict(routing)
            started.append(self.start_gateway(settings, name=f"gateway-{self._num_gateways}",
                                              ready_timeout_s=None))
        for gateway in started:
            self.wait_ready(gateway, timeout_s=30)
        return started

    def redis_calls(self) -> dict[str, int]:
        """Calls per Redis command so far (INFO commandstats), e.g. ``{"evalsha": 1200}``."""
        client = redis.Redis.from_url(self.redis_url)
        try:
            stats = client.info("commandstats")
        finally:
            client.close()
        return {name.removeprefix("cmdstat_"): int(value["calls"])
                for name, value in stats.items()}


def provision(origin: str, admin_token: str, tenants: Sequence[str], tiers: Sequence[str],
              limits: Mapping[str, int] | None = None,
              weights: Mapping[str, float] | None = None) -> dict[str, dict[str, str]]:
    """Tenants (top tier: the first of ``tiers``; fair-share ``weights``, default 1) with one
    key per tier; tenant -> tier -> key."""
    keys: dict[str, dict[str, str]] = {}
    with admin_client(origin, admin_token) as admin:
        for tenant in tenants:
            body: dict[str, Any] = {"id": tenant, "name": tenant, "tier": tiers[0]}
            if limits:
                body["limits"] = dict(limits)
            if weights and tenant in weights:
                body["weight"] = weights[tenant]
            create_tenant(admin, body)
            keys[tenant] = {tier: create_key(admin, tenant, tier=tier) for tier in tiers}
    return keys


def scrape(url: str) -> dict[str, float]:
    """A Prometheus text page as ``{"name{labels}": value}`` (samples without labels: name)."""
    return parse_samples(httpx.get(url, timeout=10).text)


def wait_idle(worker_urls: Sequence[str], timeout_s: float = 20.0) -> float:
    """Wait until no worker runs or queues a request; the seconds it took."""
    started = time.monotonic()
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    while time.monotonic() - started < timeout_s:
        busy = sum(value for url in worker_urls for key, value in scrape(url + "/metrics").items()
                   if key.partition("{")[0] in names)
        if busy == 0:
            break
        time.sleep(0.2)
    return time.monotonic() - started
