"""A fresh fleet for one routing run: a private redis-server, N simulated workers that join the
gateway through their Redis heartbeats, and a gateway with one routing profile.

``index="exact"`` configures the gateway's tokenizer for the model, so ``prefix_affinity`` uses
the exact index fed by the workers' KV events; ``index="approx"`` leaves it out, so only the
approximate index (character blocks of the gateway's own decisions) is used. Admission by SLO
is switched off: only routing is compared. Example::

    with routing_fleet(FleetSpec("prefix_affinity", "exact", num_workers=4), workdir) as fleet:
        fleet.url, fleet.worker_names, fleet.admin_token
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml

from bench.run.workers import parse_counters
from gateway.localproc import (
    ProcessGroup,
    free_port,
    free_port_range,
    python_module_argv,
    start_redis,
    wait_http,
)

MODEL = "switchyard-sim"
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

    @property
    def label(self) -> str:
        """``prefix_affinity (exact)``, or the profile name for the other profiles."""
        return f"{self.profile} ({self.index})" if self.profile.startswith("prefix_affinity") \
            else self.profile


@dataclass(frozen=True, slots=True)
class RoutingFleet:
    """A running fleet: the gateway's ``/v1`` URL and admin token, the workers by name."""

    url: str
    admin_token: str
    model: str
    worker_urls: Mapping[str, str]  # worker name (as in x-switchyard-backend) -> base URL
    pids: Mapping[str, int]  # redis, sim, gateway


def _gateway_config(spec: FleetSpec, port: int, redis_url: str, admin_token: str
                    ) -> dict[str, Any]:
    routing: dict[str, Any] = {"profile": spec.profile}
    if spec.index == "exact":
        routing["tokenizers"] = {MODEL: "approx"}
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "redis_url": redis_url,
        "admin_token": admin_token,
        "key_secret": secrets.token_urlsafe(32),
        "backends": [],
        "routing": routing,
        "admission": {"slo_enabled": False},
        "log_level": "warning",
    }


def _wait_for_workers(origin: str, admin_token: str, count: int, group: ProcessGroup,
                      timeout_s: float = 30.0) -> dict[str, str]:
    """Poll ``/admin/fleet`` until ``count`` healthy workers with fresh load have joined."""
    headers = {"Authorization": f"Bearer {admin_token}"}
    deadline = time.monotonic() + timeout_s
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        if dead := group.dead_child():
            raise RuntimeError(f"{dead} exited while the workers were joining")
        try:
            data = httpx.get(origin + "/admin/fleet", headers=headers, timeout=2).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError):
            data = []
        seen = {b["name"]: b["url"] for b in data
                if b["is_healthy"] and b["load_age_s"] is not None and b["load_age_s"] < 3}
        if len(seen) >= count:
            return seen
        time.sleep(0.1)
    raise RuntimeError(f"only {len(seen)} of {count} workers joined the gateway in {timeout_s} s")


@contextmanager
def routing_fleet(spec: FleetSpec, workdir: Path) -> Iterator[RoutingFleet]:
    """Start redis, the workers and the gateway; stop them all on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    group = ProcessGroup(log_dir=workdir)
    try:
        redis_url = start_redis(group, workdir)
        base_port = free_port_range(spec.num_workers)
        sim_args = ["--workers", str(spec.num_workers), "--base-port", str(base_port),
                    "--model", MODEL, "--tokenizer", "approx", "--redis-url", redis_url]
        if spec.num_kv_blocks is not None:
            sim_args += ["--num-kv-blocks", str(spec.num_kv_blocks)]
        if spec.speed_factor is not None:
            sim_args += ["--speed-factor", str(spec.speed_factor)]
        group.spawn("sim", python_module_argv("backends.sim", *sim_args))
        admin_token = secrets.token_urlsafe(24)
        port = free_port()
        config_path = workdir / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(
            _gateway_config(spec, port, redis_url, admin_token), sort_keys=False))
        config_path.chmod(0o600)
        # Started together: the workers join the gateway through Redis whenever both are up.
        group.spawn("gateway", python_module_argv("gateway", "serve", "--config",
                                                  str(config_path)))
        origin = f"http://127.0.0.1:{port}"
        wait_http(origin + "/healthz", timeout_s=30, group=group)
        workers = _wait_for_workers(origin, admin_token, spec.num_workers, group)
        yield RoutingFleet(url=origin + "/v1", admin_token=admin_token, model=MODEL,
                           worker_urls=workers,
                           pids={name: child.pid for name, child in group.children})
    finally:
        group.stop_all(grace_s=5)


def _scrape_one(client: httpx.Client, url: str) -> dict[str, float]:
    text = client.get(url + "/metrics").raise_for_status().text
    counters = parse_counters(text)
    for name, metric in _EXTRA_COUNTERS.items():
        counters[name] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                             if line.startswith(metric) and line[len(metric)] in "{ ")
    profile = client.get(url + "/sim/profile").raise_for_status().json()
    counters["num_steps"] = float(profile["num_steps"])
    counters["lateness_s"] = float(profile["total_lateness_s"])
    return counters


def scrape_gateway(fleet: RoutingFleet) -> dict[str, float]:
    """The gateway's routing counters: prompt tokens routed, and of them the tokens the chosen
    backend was expected to hold in its prefix cache."""
    text = httpx.get(fleet.url.removesuffix("/v1") + "/metrics", timeout=5).text
    return {name: sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith(metric + " "))
            for name, metric in _GATEWAY_COUNTERS.items()}


def scrape_workers(worker_urls: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Each worker's counters: requests, prompt / generated / cache-hit tokens, preemptions
    (its /metrics), engine steps and how late its loop ran (its /sim/profile)."""
    with httpx.Client(timeout=5) as client:
        return {name: _scrape_one(client, url) for name, url in worker_urls.items()}
