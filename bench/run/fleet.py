"""``--fleet sim:N`` (or ``mock:N``): a private redis-server, N engines and a gateway, started
for one run and stopped after it, so one command is a whole experiment.

The engines are simulated GPU workers (``backends.sim``, publishing to the private Redis) or
zero-delay mock engines; the gateway gets a fresh admin token, through which the run makes its
tenants and keys. Logs go to ``workdir``. Example::

    with local_fleet("sim", 4, workdir, tokenizer="approx") as fleet:
        fleet.url, fleet.admin_token, fleet.worker_metrics
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    free_port_range,
    python_module_argv,
    start_redis,
    wait_http,
)

MODELS = {"sim": "switchyard-sim", "mock": "switchyard-mock"}


@dataclass(frozen=True, slots=True)
class LocalFleet:
    """A running fleet: the gateway's ``/v1`` URL, its admin token, the engines' /metrics."""

    url: str
    admin_token: str
    model: str
    worker_metrics: tuple[str, ...]
    pids: dict[str, int]


def _start_engines(group: ProcessGroup, kind: str, count: int, model: str, redis_url: str,
                   tokenizer: str) -> list[str]:
    if kind == "sim":
        base_port = free_port_range(count)
        group.spawn("sim", python_module_argv(
            "backends.sim", "--workers", str(count), "--base-port", str(base_port),
            "--model", model, "--tokenizer", tokenizer, "--redis-url", redis_url,
        ))
        ports = list(range(base_port, base_port + count))
    else:
        ports = [free_port() for _ in range(count)]
        for index, port in enumerate(ports):
            group.spawn(f"mock-{index}", python_module_argv(
                "backends.mock", "--port", str(port), "--model", model))
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for url in urls:
        wait_http(url + "/health", timeout_s=60, group=group)
    return urls


@contextmanager
def local_fleet(kind: str, count: int, workdir: Path, tokenizer: str = "approx"
                ) -> Iterator[LocalFleet]:
    """Start redis, ``count`` engines of ``kind`` and a gateway; stop them all on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    model = MODELS[kind]
    group = ProcessGroup(log_dir=workdir)
    try:
        redis_url = start_redis(group, workdir)
        engine_urls = _start_engines(group, kind, count, model, redis_url, tokenizer)
        admin_token = secrets.token_urlsafe(24)
        port = free_port()
        config: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": port},
            "redis_url": redis_url,
            "admin_token": admin_token,
            "key_secret": secrets.token_urlsafe(32),
            "backends": [{"name": f"{kind}-{i}", "url": url, "models": [model]}
                         for i, url in enumerate(engine_urls)],
            "log_level": "warning",
        }
        config_path = workdir / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        config_path.chmod(0o600)
        gateway = group.spawn("gateway", python_module_argv("gateway", "serve", "--config",
                                                            str(config_path)))
        origin = f"http://127.0.0.1:{port}"
        wait_http(origin + "/readyz", timeout_s=30, group=group)
        pids = {name: child.pid for name, child in group.children}
        yield LocalFleet(url=origin + "/v1", admin_token=admin_token, model=model,
                         worker_metrics=tuple(url + "/metrics" for url in engine_urls),
                         pids={"gateway": gateway.pid, **pids})
    finally:
        group.stop_all(grace_s=5)
