"""A benchmark fleet: a private redis-server, one mock engine, one gateway process, and a bare
pass-through proxy (`bench.overhead.bare_proxy`) in front of the same engine as the floor to
compare with.

Example::

    with bench_fleet(workdir) as fleet:
        fleet.gateway_url, fleet.api_key, fleet.gateway_pid
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    python_module_argv,
    start_redis,
    wait_http,
)

MODEL = "switchyard-mock"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class BenchFleet:
    engine_url: str
    engine_pid: int
    gateway_url: str
    gateway_pid: int
    floor_url: str
    floor_pid: int
    api_key: str
    model: str = MODEL

    def streamed_chunks(self) -> float:
        """The gateway's count of chunks relayed to clients (its Prometheus counter)."""
        text = httpx.get(self.gateway_url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("switchyard_streamed_chunks_total "):
                return float(line.split()[1])
        return 0.0


@contextmanager
def bench_fleet(workdir: Path, model: str = MODEL) -> Iterator[BenchFleet]:
    """Start everything, create a tenant and key through the admin API; stop it all on exit."""
    group = ProcessGroup(log_dir=workdir)
    try:
        redis_url = start_redis(group, workdir)
        engine_port = free_port()
        engine_url = f"http://127.0.0.1:{engine_port}"
        engine = group.spawn(
            "engine", python_module_argv("backends.mock", "--port", str(engine_port),
                                         "--model", model),
        )
        wait_http(engine_url + "/health", group=group)
        floor_port = free_port()
        floor = group.spawn(
            "bare-proxy", python_module_argv("bench.overhead.bare_proxy", "--port", str(floor_port),
                                             "--upstream", engine_url),
        )
        floor_url = f"http://127.0.0.1:{floor_port}"
        wait_http(floor_url + "/health", group=group)
        admin_token = secrets.token_urlsafe(24)
        gateway_port = free_port()
        config: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": gateway_port},
            "redis_url": redis_url,
            "admin_token": admin_token,
            "key_secret": secrets.token_urlsafe(32),
            "backends": [{"name": "engine", "url": engine_url, "models": [model]}],
            "log_level": "warning",
        }
        config_path = workdir / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config))
        gateway = group.spawn(
            "gateway", python_module_argv("gateway", "serve", "--config", str(config_path)),
        )
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        try:
            wait_http(gateway_url + "/readyz", group=group)
        except RuntimeError as exc:
            log_tail = _tail(workdir / "gateway.log")
            raise RuntimeError(f"{exc}\n--- gateway log ---\n{log_tail}") from None
        yield BenchFleet(
            engine_url=engine_url, engine_pid=engine.pid, gateway_url=gateway_url,
            gateway_pid=gateway.pid, floor_url=floor_url, floor_pid=floor.pid,
            api_key=_new_key(gateway_url, admin_token, model), model=model,
        )
    finally:
        group.stop_all(grace_s=5)


def _new_key(gateway_url: str, admin_token: str, model: str) -> str:
    headers = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=gateway_url, headers=headers, timeout=10) as admin:
        tenant = admin.post("/admin/tenants", json={"name": "bench", "models": [model]})
        tenant.raise_for_status()
        key = admin.post("/admin/keys", json={"tenant_id": tenant.json()["id"], "name": "bench"})
        key.raise_for_status()
        return str(key.json()["key"])


def _tail(path: Path, num_lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except OSError:
        return "(no log)"
