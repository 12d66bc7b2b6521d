"""A fresh fleet for one routing run: a private redis-server, N simulated workers, and a
gateway with one routing profile.

``mode="own"`` (`bench.common.fleet_modes`): the workers join the gateway through their Redis
heartbeats and publish KV events. ``mode="third-party"``: the same workers run without Redis and
the gateway lists them in ``backends:`` with worker discovery off, loading them from their
``/metrics`` and discovering their profile there and on ``/v1/models``. ``index="exact"``
(own mode only) configures the gateway's tokenizer for the model, so ``prefix_affinity`` uses
the exact index fed by the workers' KV events; ``index="approx"`` leaves it out, so only the
approximate index (character blocks of the gateway's own decisions) is used. Admission by SLO
is switched off: only routing is compared. Example::

    with routing_fleet(FleetSpec("prefix_affinity", "exact", num_workers=4), workdir) as fleet:
        fleet.url, fleet.worker_urls, fleet.admin_token
    with routing_fleet(FleetSpec("round_robin", mode="third-party"), workdir) as fleet:
        fleet.backends["sources"]   # ["config"]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from backends.fleet.prom import metric_sums
from bench.common.fleet_modes import Mode, describe, static_backends, wait_for_backends
from bench.run.workers import parse_counters
from gateway.cli.localfleet import SIM_MODEL, LocalFleet

MODEL = SIM_MODEL
ENGINE_LOG = "sim-requests.jsonl"  # FleetSpec.engine_log's file in the fleet's folder
Index = Literal["approx", "exact"]
# Counters read from each worker before and after a run (see `scrape_workers`).
_EXTRA_COUNTERS = {"generation_tokens": "vllm:generation_tokens_total",
                   "cache_hit_tokens": "vllm:prefix_cache_hits_total",
                   "cache_query_tokens": "vllm:prefix_cache_queries_total",
                   "preemptions": "vllm:num_preemptions_total"}
_GATEWAY_COUNTERS = {"prompt_tokens": "switchyard_routing_prompt_tokens_total",
                     "expected_cached_tokens": "switchyard_routing_expected_cached_tokens_total"}


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """What to start: the routing profile, which prefix index, the workers' shape."""

    profile: str
    index: Index = "approx"
    num_workers: int = 4
    num_kv_blocks: int | None = None  # None: the sim's default (24,576 blocks of 16 tokens)
    speed_factor: float | None = None  # None: the sim's default (1.0, one H100)
    mode: Mode = "own"
    # The simulated engines log each request's phases (queue, prefill) to ENGINE_LOG in the
    # fleet's folder (``backends.sim --request-log``).
    engine_log: bool = False

    def __post_init__(self) -> None:
        if self.mode == "third-party" and self.index == "exact":
            raise ValueError("a third-party fleet sends no KV events: only the approximate "
                             "index exists (index='approx')")

    @property
    def label(self) -> str:
        """``prefix_affinity (exact)``, or the profile name for the other profiles."""
        return f"{self.profile} ({self.index})" if self.profile.startswith("prefix_affinity") \
            else self.profile


@dataclass(frozen=True, slots=True)
class RoutingFleet:
    """A running fleet: the gateway's ``/v1`` URL and admin token, the workers by name."""

    url: str
    redis_url: str
    admin_token: str
    model: str
    worker_urls: Mapping[str, str]  # worker name (as in x-switchyard-backend) -> base URL
    pids: Mapping[str, int]  # redis, sim, gateway
    backends: Mapping[str, Any]  # how the gateway knows them (`bench.common.fleet_modes.describe`)


def gateway_settings(spec: FleetSpec, worker_urls: list[str]) -> dict[str, Any]:
    routing: dict[str, Any] = {"profile": spec.profile}
    if spec.index == "exact":
        routing["tokenizers"] = {MODEL: "approx"}
    backends: list[dict[str, Any]] = []
    if spec.mode == "third-party":
        routing["discover_workers"] = False
        backends = static_backends(worker_urls, MODEL)
    return {"backends": backends, "routing": routing, "admission": {"slo_enabled": False},
            "log_level": "warning"}


def start_workers(fleet: LocalFleet, spec: FleetSpec) -> list[str]:
    """The spec's simulated workers in ``fleet``; their base URLs. Third-party: up (healthy)
    before the gateway, whose first look reads their profiles before it serves. Own mode: the
    workers join the gateway through Redis whenever both are up."""
    flags = []
    if spec.num_kv_blocks is not None:
        flags += ["--num-kv-blocks", str(spec.num_kv_blocks)]
    if spec.speed_factor is not None:
        flags += ["--speed-factor", str(spec.speed_factor)]
    if spec.engine_log:
        flags += ["--request-log", str(fleet.workdir / ENGINE_LOG)]
    is_own = spec.mode == "own"
    return fleet.start_sims(spec.num_workers, model=MODEL, has_redis=is_own, flags=flags,
                            health_timeout_s=None if is_own else 30)


@contextmanager
def routing_fleet(spec: FleetSpec, workdir: Path) -> Iterator[RoutingFleet]:
    """Start redis, the workers and the gateway; stop them all on exit."""
    with LocalFleet(workdir, grace_s=5) as fleet:
        worker_urls = start_workers(fleet, spec)
        gateway = fleet.start_gateway(gateway_settings(spec, worker_urls),
                                      ready_path="/healthz", ready_timeout_s=30)
        snapshot = wait_for_backends(gateway.url, fleet.admin_token, spec.num_workers,
                                     spec.mode, fleet.group)
        yield RoutingFleet(url=gateway.url + "/v1", redis_url=fleet.redis_url,
                           admin_token=fleet.admin_token, model=MODEL,
                           worker_urls={b["name"]: b["url"] for b in snapshot},
                           pids={name: child.pid for name, child in fleet.group.children},
                           backends=describe(snapshot))


def _scrape_one(client: httpx.Client, url: str) -> dict[str, float]:
    text = client.get(url + "/metrics").raise_for_status().text
    counters = parse_counters(text) | dict.fromkeys(_EXTRA_COUNTERS, 0.0) | metric_sums(
        text, {name: (metric,) for name, metric in _EXTRA_COUNTERS.items()})
    profile = client.get(url + "/sim/profile").raise_for_status().json()
    counters["num_steps"] = float(profile["num_steps"])
    counters["lateness_s"] = float(profile["total_lateness_s"])
    return counters


def scrape_gateway(fleet: RoutingFleet) -> dict[str, float]:
    """The gateway's routing counters: prompt tokens routed, and of them the tokens the chosen
    backend was expected to hold in its prefix cache."""
    text = httpx.get(fleet.url.removesuffix("/v1") + "/metrics", timeout=5).text
    return dict.fromkeys(_GATEWAY_COUNTERS, 0.0) | metric_sums(
        text, {name: (metric,) for name, metric in _GATEWAY_COUNTERS.items()})


def scrape_workers(worker_urls: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Each worker's counters: requests, prompt / generated / cache-hit tokens, preemptions
    (its /metrics), engine steps and how late its loop ran (its /sim/profile)."""
    with httpx.Client(timeout=5) as client:
        return {name: _scrape_one(client, url) for name, url in worker_urls.items()}
