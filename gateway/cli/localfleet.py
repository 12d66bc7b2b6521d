"""A local fleet in one object: a private redis-server, engines and gateways on loopback.

``switchyard up``, the benchmarks and ``scripts/vllm`` start their fleets through `LocalFleet`,
so every one of them starts the same processes with the same flags and writes its gateway
configuration the same way. Every gateway of a fleet shares its Redis, admin token and key
secret, so tenants and keys made through one work through all. Example::

    with LocalFleet(workdir) as fleet:
        fleet.start_sims(2)                          # join the gateway by Redis heartbeat
        gateway = fleet.start_gateway({"backends": []})
        key = fleet.create_tenant_key(gateway.url, {"name": "demo", "models": ["*"]})
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

import httpx
import yaml

from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    free_port_range,
    python_module_argv,
    start_redis,
    start_redis_cluster,
    wait_http,
)
from gateway.tenancy import new_secret

__all__ = [
    "MOCK_MODEL", "SIM_MODEL", "WORKER_MODEL", "GatewayProc", "LocalFleet", "admin_client",
    "catch_stop_signals", "create_key", "create_tenant",
]

SIM_MODEL = "switchyard-sim"
MOCK_MODEL = "switchyard-mock"
WORKER_MODEL = "SmolLM2-135M-Instruct"  # what `switchyard worker` serves by default
_WILDCARD_HOSTS = ("0.0.0.0", "::")


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


class LocalFleet:
    """A `ProcessGroup` logging to ``workdir``, a private Redis (unless ``redis_url`` names
    one; a 3-primary Redis Cluster with ``redis_cluster``), and a fresh admin token and key
    secret; every child is stopped on exit, each given ``grace_s`` after SIGTERM."""

    def __init__(self, workdir: Path, *, redis_url: str | None = None,
                 grace_s: float = 10.0, redis_cluster: bool = False) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.group = ProcessGroup(log_dir=workdir)
        self.redis_url = redis_url or ""
        self.redis_ports: list[int] = []  # a private cluster's nodes, primaries first
        self._redis_cluster = redis_cluster
        self.admin_token = new_secret(24)
        self.key_secret = new_secret(32)
        self._grace_s = grace_s

    def __enter__(self) -> Self:
        if not self.redis_url:
            try:
                if self._redis_cluster:
                    self.redis_url, self.redis_ports = start_redis_cluster(self.group,
                                                                           self.workdir)
                else:
                    self.redis_url = start_redis(self.group, self.workdir)
            except BaseException:
                self.group.stop_all(grace_s=self._grace_s)
                raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.group.stop_all(grace_s=self._grace_s)

    def start_sims(self, count: int, *, model: str = SIM_MODEL, tokenizer: str = "approx",
                   has_redis: bool = True, flags: Sequence[str] = (),
                   health_timeout_s: float | None = 60.0) -> list[str]:
        """One ``backends.sim`` process (``sim``) running ``count`` simulated workers on
        consecutive free ports, publishing to the fleet's Redis (``has_redis``) or not a word
        to Redis (a third-party fleet); their base URLs, once they answer ``/health`` unless
        ``health_timeout_s`` is None."""
        base_port = free_port_range(count)
        argv = ["--workers", str(count), "--base-port", str(base_port),
                "--model", model, "--tokenizer", tokenizer]
        if has_redis:
            argv += ["--redis-url", self.redis_url]
        self.group.spawn("sim", python_module_argv("backends.sim", *argv, *flags))
        urls = [f"http://127.0.0.1:{port}" for port in range(base_port, base_port + count)]
        if health_timeout_s is not None:
            self.wait_healthy(urls, health_timeout_s)
        return urls

    def start_mocks(self, names: Sequence[str], *, model: str = MOCK_MODEL,
                    flags: Sequence[str] = (), health_timeout_s: float | None = 20.0
                    ) -> list[str]:
        """One ``backends.mock`` engine per name, each on a free port; their base URLs, once
        they answer ``/health`` unless ``health_timeout_s`` is None."""
        ports = [free_port() for _ in names]
        for name, port in zip(names, ports, strict=True):
            self.group.spawn(name, python_module_argv(
                "backends.mock", "--port", str(port), "--model", model, *flags))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        if health_timeout_s is not None:
            self.wait_healthy(urls, health_timeout_s)
        return urls

    def start_pytorch_workers(self, count: int, *, health_timeout_s: float | None = 180.0
                              ) -> list[str]:
        """``count`` bundled PyTorch workers (``switchyard worker``) on the CPU, joining through
        Redis, one intra-op thread each beyond the first (they share this machine with
        everything else); their base URLs. Each loads the model and times a prefill before it
        answers ``/health``."""
        urls = []
        for index in range(count):
            port = free_port()
            self.group.spawn(f"pytorch-worker-{index}", python_module_argv(
                "gateway", "worker", "--device", "cpu", "--host", "127.0.0.1",
                "--port", str(port), "--redis-url", self.redis_url,
                "--worker-id", f"pytorch-{index}", *(("--num-threads", "1") if count > 1 else ()),
            ))
            urls.append(f"http://127.0.0.1:{port}")
        if health_timeout_s is not None:
            self.wait_healthy(urls, health_timeout_s)
        return urls

    def wait_healthy(self, urls: Sequence[str], timeout_s: float) -> None:
        for url in urls:
            wait_http(url + "/health", timeout_s=timeout_s, group=self.group)

    def start_gateway(self, settings: Mapping[str, Any], *, name: str = "gateway",
                      host: str = "127.0.0.1", port: int | None = None,
                      config_name: str | None = None, serve_argv: Sequence[str] | None = None,
                      ready_path: str = "/readyz", ready_timeout_s: float | None = 20.0,
                      env: dict[str, str] | None = None) -> GatewayProc:
        """A gateway process ``name`` listening on ``host:port`` (a free port by default),
        configured by the fleet's Redis, admin token and key secret plus ``settings``, written
        to ``config_name`` (default ``NAME.yaml``) in the workdir, readable by this user only.
        ``env`` adds to the environment it inherits. It is waited for on ``ready_path`` unless
        ``ready_timeout_s`` is None."""
        port = free_port() if port is None else port
        config = {"listen": {"host": host, "port": port}, "redis_url": self.redis_url,
                  "admin_token": self.admin_token, "key_secret": self.key_secret, **settings}
        config_path = self.workdir / (config_name or f"{name}.yaml")
        _write_private(config_path, yaml.safe_dump(config, sort_keys=False))
        argv = serve_argv or python_module_argv("gateway", "serve")
        child = self.group.spawn(name, [*argv, "--config", str(config_path)], env=env)
        origin_host = "127.0.0.1" if host in _WILDCARD_HOSTS else host
        gateway = GatewayProc(f"http://{origin_host}:{port}", child.pid,
                              self.workdir / f"{name}.log")
        if ready_timeout_s is not None:
            self.wait_ready(gateway, ready_path, ready_timeout_s)
        return gateway

    def wait_ready(self, gateway: GatewayProc, path: str = "/readyz",
                   timeout_s: float = 20.0) -> None:
        """Wait for ``gateway`` to answer ``path``; on failure the error ends with its log."""
        try:
            wait_http(gateway.url + path, timeout_s=timeout_s, group=self.group)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n--- {gateway.log_path.name} ---\n"
                               f"{gateway.log_tail()}") from None

    def create_tenant_key(self, origin: str, tenant: Mapping[str, Any], *,
                          is_existing_ok: bool = False, **key_fields: Any) -> str:
        """A tenant (``POST /admin/tenants`` with ``tenant``; one that exists already is fine
        with ``is_existing_ok``) and a key for it (``key_fields``: name, tier, ...)."""
        with admin_client(origin, self.admin_token) as admin:
            tenant_id = create_tenant(admin, tenant, is_existing_ok=is_existing_ok)
            return create_key(admin, tenant_id, **key_fields)

    def pids(self) -> dict[str, int]:
        """Process ids by role: ``redis``, then every other child by its name."""
        return {("redis" if name.startswith("redis-") else name): child.pid
                for name, child in self.group.children}

    def serve_until_stopped(self, is_stopped: Callable[[], bool], label: str,
                            interval_s: float = 0.2) -> int:
        """Watch the children until ``is_stopped()`` (0) or one stops on its own (1); say
        which on stdout. The caller leaves the ``with`` block next, which stops them all."""
        while not is_stopped():
            if dead := self.group.dead_child(is_clean_exit_ok=False):
                print(f"\n{dead} stopped unexpectedly; logs in {self.workdir}. Shutting down.")
                return 1
            time.sleep(interval_s)
        print(f"\nstopping {label} ...", flush=True)
        return 0


def admin_client(origin: str, admin_token: str) -> httpx.Client:
    return httpx.Client(base_url=origin, timeout=10,
                        headers={"Authorization": f"Bearer {admin_token}"})


def create_tenant(admin: httpx.Client, tenant: Mapping[str, Any], *,
                  is_existing_ok: bool = False) -> str:
    """Create ``tenant`` (a ``POST /admin/tenants`` body); its id."""
    made = admin.post("/admin/tenants", json=dict(tenant))
    if is_existing_ok and made.status_code == 409 and "id" in tenant:
        return str(tenant["id"])
    if made.status_code != 201:
        label = tenant.get("id") or tenant.get("name")
        raise RuntimeError(f"cannot create tenant {label}: {made.text[:300]}")
    return str(made.json()["id"])


def create_key(admin: httpx.Client, tenant_id: str, **fields: Any) -> str:
    """A new key of ``tenant_id`` (``fields``: name, tier, ...); its plaintext."""
    made = admin.post("/admin/keys", json={"tenant_id": tenant_id, **fields})
    if made.status_code != 201:
        detail = "".join(f" {name}={value}" for name, value in fields.items())
        raise RuntimeError(f"cannot create a key{detail} for tenant {tenant_id}: "
                           f"{made.text[:300]}")
    return str(made.json()["key"])


def catch_stop_signals() -> Callable[[], bool]:
    """From now on SIGINT and SIGTERM only set a flag, so a fleet can stop in order; a
    function that reads the flag."""
    is_requested = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal is_requested
        is_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return lambda: is_requested


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (it holds secrets)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    path.chmod(0o600)
