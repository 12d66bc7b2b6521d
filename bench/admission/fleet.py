"""Processes of the admission benchmark: a private Redis, engines, gateways; and what they say.

``Fleet`` holds one Redis and a `ProcessGroup`; engines (simulated workers joining through Redis
heartbeats, the same workers without Redis for a third-party fleet
(`bench.common.fleet_modes`), or a zero-delay mock engine listed in the configuration) and
gateways are started into it. Every
gateway shares the admin token and key secret, so tenants and keys made through one work
through all. Example::

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

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import redis
import yaml

from backends.fleet.prom import parse_samples
from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    free_port_range,
    python_module_argv,
    start_redis,
    wait_http,
)

SIM_MODEL = "switchyard-sim"
MOCK_MODEL = "switchyard-mock"


@dataclass(frozen=True, slots=True)
class GatewayProc:
    """A running gateway: its origin URL, process id and log file."""

    url: str
    pid: int
    log_path: Path

    def log_tail(self, num_lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        except OSError:
            return "(no log)"


class Fleet:
    """A private Redis and the children started around it; all stopped on exit."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.group = ProcessGroup(log_dir=workdir)
        self.admin_token = secrets.token_urlsafe(24)
        self.key_secret = secrets.token_urlsafe(32)
        self.redis_url = ""
        self._num_gateways = 0

    def __enter__(self) -> Fleet:
        self.redis_url = start_redis(self.group, self.workdir)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.group.stop_all(grace_s=5)

    def start_sim(self, num_workers: int, has_redis: bool = True,
                  **profile: float | int) -> list[str]:
        """Simulated workers, joining through Redis heartbeats (``has_redis``) or not a word to
        Redis (a third-party fleet); their base URLs once they answer."""
        base = free_port_range(num_workers)
        flags = [item for name, value in profile.items()
                 for item in ("--" + name.replace("_", "-"), str(value))]
        if has_redis:
            flags += ["--redis-url", self.redis_url, "--heartbeat-interval-s", "0.5"]
        self.group.spawn("sim", python_module_argv(
            "backends.sim", "--workers", str(num_workers), "--base-port", str(base),
            "--model", SIM_MODEL, "--tokenizer", "approx", *flags))
        urls = [f"http://127.0.0.1:{base + i}" for i in range(num_workers)]
        for url in urls:
            wait_http(url + "/health", timeout_s=60, group=self.group)
        return urls

    def start_mock(self) -> dict[str, Any]:
        """One zero-delay mock engine; its backend entry for a gateway configuration."""
        port = free_port()
        self.group.spawn("mock", python_module_argv("backends.mock", "--port", str(port),
                                                    "--model", MOCK_MODEL))
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", group=self.group)
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
            port = free_port()
            self._num_gateways += 1
            name = f"gateway-{self._num_gateways}"
            config = {
                "listen": {"host": "127.0.0.1", "port": port}, "redis_url": self.redis_url,
                "admin_token": self.admin_token, "key_secret": self.key_secret,
                "backends": list(backends), "log_level": "warning",
                "admission": {"slo_enabled": slo_enabled, **extra},
            }
            if routing is not None:
                config["routing"] = dict(routing)
            path = self.workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            path.chmod(0o600)
            child = self.group.spawn(name, python_module_argv("gateway", "serve", "--config",
                                                              str(path)))
            started.append(GatewayProc(f"http://127.0.0.1:{port}", child.pid,
                                       self.workdir / f"{name}.log"))
        for gateway in started:
            try:
                wait_http(gateway.url + "/readyz", timeout_s=30, group=self.group)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}\n--- {gateway.log_path.name} ---\n"
                                   f"{gateway.log_tail()}") from None
        return started

    def pids(self) -> dict[str, int]:
        """Process ids by role: ``redis``, ``sim``, ``mock``, ``gateway-N``."""
        return {("redis" if name.startswith("redis-") else name): child.pid
                for name, child in self.group.children}

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
    with httpx.Client(base_url=origin, timeout=10,
                      headers={"Authorization": f"Bearer {admin_token}"}) as admin:
        for tenant in tenants:
            body: dict[str, Any] = {"id": tenant, "name": tenant, "tier": tiers[0]}
            if limits:
                body["limits"] = dict(limits)
            if weights and tenant in weights:
                body["weight"] = weights[tenant]
            made = admin.post("/admin/tenants", json=body)
            if made.status_code != 201:
                raise RuntimeError(f"cannot create tenant {tenant}: {made.text[:300]}")
            keys[tenant] = {}
            for tier in tiers:
                key = admin.post("/admin/keys", json={"tenant_id": tenant, "tier": tier})
                if key.status_code != 201:
                    raise RuntimeError(f"cannot create a {tier} key: {key.text[:300]}")
                keys[tenant][tier] = str(key.json()["key"])
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
