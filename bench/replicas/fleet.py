"""A fresh fleet with N gateway replicas behind one round-robin front.

A private redis-server, one ``backends.sim`` process running the simulated workers (the routing
bench's KV pressure), N gateways with one configuration (`bench.routing.fleet`'s settings for
``prefix_affinity``: SLO admission off, the exact index in own mode, the approximate one in
third-party mode) sharing the Redis, and `bench.replicas.balancer` in front of them. With
``is_shared=False`` (third-party mode only) each gateway keeps its state in memory
(``state: memory``): no approximate-index sharing, tenants and keys per replica. Example::

    with replica_fleet(ReplicaSpec("third-party", 4, num_kv_blocks=1100), workdir) as fleet:
        fleet.url                       # the front's /v1
        fleet.replicas[0].url           # one replica, directly
        fleet.restart_replica(3)        # SIGTERM, then the same configuration on the same port
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.common.fleet_modes import Mode, describe, wait_for_backends
from bench.routing.fleet import MODEL, FleetSpec, RoutingFleet, gateway_settings, start_workers
from gateway.cli.localfleet import GatewayProc, LocalFleet, admin_client, create_tenant
from gateway.cli.localproc import free_port, python_module_argv, wait_http

PROFILE = "prefix_affinity"


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """What to start: the fleet mode, how many replicas, the workers' shape, whether the
    replicas share state through Redis."""

    mode: Mode
    num_replicas: int
    num_workers: int = 4
    num_kv_blocks: int | None = None
    speed_factor: float | None = None
    is_shared: bool = True
    # Gateway settings set over the bench's (dotted path, value), e.g. ("routing.share_push_ms",
    # 5): for experiments, recorded with the run.
    overrides: tuple[tuple[str, Any], ...] = ()
    engine_log: bool = False  # FleetSpec.engine_log

    def __post_init__(self) -> None:
        if not self.is_shared and self.mode == "own":
            raise ValueError("own-mode workers join through Redis: replicas without shared "
                             "state exist only in third-party mode")

    @property
    def routing_spec(self) -> FleetSpec:
        return FleetSpec(PROFILE, "exact" if self.mode == "own" else "approx",
                         num_workers=self.num_workers, num_kv_blocks=self.num_kv_blocks,
                         speed_factor=self.speed_factor, mode=self.mode,
                         engine_log=self.engine_log)


@dataclass(slots=True)
class ReplicaFleet:
    """A running fleet: the front (as a `RoutingFleet`, so `bench.routing` 's helpers take it),
    the replicas, and how to restart one."""

    spec: ReplicaSpec
    front: RoutingFleet
    replicas: list[GatewayProc]
    local: LocalFleet
    settings: Mapping[str, Any]
    front_pid: int

    @property
    def url(self) -> str:
        return self.front.url

    @property
    def admin_token(self) -> str:
        return self.local.admin_token

    @property
    def is_shared(self) -> bool:
        return self.spec.is_shared

    def local_admin(self, index: int = 0) -> httpx.Client:
        """An admin client of replica ``index``."""
        return admin_client(self.replicas[index].url, self.admin_token)

    def pids(self) -> dict[str, int]:
        return self.local.pids()

    def replica_fleet(self, index: int) -> RoutingFleet:
        """One replica as a `RoutingFleet` (its own ``/v1``)."""
        return replace(self.front, url=self.replicas[index].url + "/v1")

    def restart_replica(self, index: int, timeout_s: float = 30.0) -> dict[str, float]:
        """SIGTERM replica ``index``, wait for it to exit, start it again on the same port with
        the same configuration; the monotonic times it was stopped, exited and started."""
        old = self.replicas[index]
        name = f"gateway-{index}"
        child = next(c for n, c in self.local.group.children if c.pid == old.pid)
        stopped_s = time.monotonic()
        os.kill(old.pid, signal.SIGTERM)
        child.wait(timeout=timeout_s)
        exited_s = time.monotonic()
        # Forget the exited child, so the group's "a child died" checks do not trip on it.
        self.local.group.children[:] = [(n, c) for n, c in self.local.group.children
                                        if c is not child]
        started_s = time.monotonic()
        self.replicas[index] = self.local.start_gateway(
            self.settings, name=name, port=urlsplit(old.url).port,
            config_name=f"{name}.yaml", ready_timeout_s=None)
        return {"stopped_s": stopped_s, "exited_s": exited_s, "started_s": started_s}

    def provision_everywhere(self, tenant: Mapping[str, Any], key: str) -> None:
        """Replicas without shared state: make ``tenant`` and import ``key`` on every replica
        but the first (where the key was made)."""
        for replica in self.replicas[1:]:
            with admin_client(replica.url, self.admin_token) as admin:
                create_tenant(admin, tenant, is_existing_ok=True)
                made = admin.post("/admin/keys/import",
                                  json={"tenant_id": tenant["id"], "key": key})
                if made.status_code not in (201, 409):
                    raise RuntimeError(f"cannot import a key into {replica.url}: "
                                       f"{made.status_code} {made.text[:300]}")


def _settings(spec: ReplicaSpec, worker_urls: list[str]) -> dict[str, Any]:
    settings = gateway_settings(spec.routing_spec, worker_urls)
    if not spec.is_shared:
        settings["state"] = "memory"
    for path, value in spec.overrides:
        set_dotted(settings, path, value)
    return settings


def set_dotted(settings: dict[str, Any], path: str, value: Any) -> None:
    """``settings[a][b][c] = value`` for ``path`` "a.b.c", making the mappings on the way."""
    *parents, last = path.split(".")
    node = settings
    for name in parents:
        child = node.setdefault(name, {})
        if not isinstance(child, dict):
            raise ValueError(f"--set {path}: {name} is {child!r}, not a section")
        node = child
    node[last] = value


@contextmanager
def replica_fleet(spec: ReplicaSpec, workdir: Path) -> Iterator[ReplicaFleet]:
    """Start redis, the workers, ``spec.num_replicas`` gateways and the front; stop them all
    on exit."""
    with LocalFleet(workdir, grace_s=5) as local:
        worker_urls = start_workers(local, spec.routing_spec)
        settings = _settings(spec, worker_urls)
        replicas = [local.start_gateway(settings, name=f"gateway-{i}", ready_timeout_s=None)
                    for i in range(spec.num_replicas)]
        snapshot: list[dict[str, Any]] = []
        for replica in replicas:
            local.wait_ready(replica, "/healthz", timeout_s=30)
            snapshot = wait_for_backends(replica.url, local.admin_token, spec.num_workers,
                                         spec.mode, local.group)
        port = free_port()
        upstreams = [item for r in replicas
                     for item in ("--upstream", str(urlsplit(r.url).port))]
        front = local.group.spawn("front", python_module_argv(
            "bench.replicas.balancer", "--port", str(port), *upstreams))
        origin = f"http://127.0.0.1:{port}"
        wait_http(origin + "/healthz", timeout_s=20, group=local.group)
        routing = RoutingFleet(url=origin + "/v1", redis_url=local.redis_url,
                               admin_token=local.admin_token, model=MODEL,
                               worker_urls={b["name"]: b["url"] for b in snapshot},
                               pids=local.pids(), backends=describe(snapshot))
        yield ReplicaFleet(spec, routing, replicas, local, settings, front.pid)
