"""Test fleets: real redis-server, real mock engines and real gateway processes on loopback."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.cli.localproc import ProcessGroup, free_port, python_module_argv, wait_http

ADMIN_TOKEN = "test-admin-token-0123456789"
KEY_SECRET = "test-key-secret-abcdefghijklmnop"
MODEL = "switchyard-mock"


class Engine:
    """A mock engine process (backends.mock) on a loopback port."""

    def __init__(self, group: ProcessGroup, name: str, models: tuple[str, ...] = (MODEL,),
                 extra: tuple[str, ...] = ()) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.models = models
        argv = python_module_argv("backends.mock", "--port", str(self.port), *extra)
        for model in models:
            argv += ["--model", model]
        self.process = group.spawn(name, argv)
        wait_http(self.url + "/health", group=group)

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/mock/stats", timeout=5).json())

    def reset(self) -> None:
        httpx.post(self.url + "/mock/reset", timeout=5).raise_for_status()

    def backend_config(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "models": list(self.models)}


class Gateway:
    """A `switchyard serve` process with its own YAML configuration."""

    def __init__(self, group: ProcessGroup, workdir: Path, redis_url: str,
                 backends: list[dict[str, Any]], **overrides: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": self.port},
            "redis_url": redis_url,
            "admin_token": ADMIN_TOKEN,
            "key_secret": KEY_SECRET,
            "backends": backends,
            "upstream": {"health_interval_s": 0.5, "health_timeout_s": 0.5},
            "log_level": "warning",
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        self.config_path = workdir / f"gateway-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen[bytes] = group.spawn(
            f"gateway-{self.port}",
            python_module_argv("gateway", "serve", "--config", str(self.config_path)),
            quiet=False,
        )
        wait_http(self.url + "/readyz", group=group)
        self.admin = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
        )

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def create_tenant(self, models: list[str] | None = None, **fields: Any) -> dict[str, Any]:
        body = {"id": f"t-{uuid.uuid4().hex[:10]}", "name": "test tenant", **fields}
        if models is not None:
            body["models"] = models
        response = self.admin.post("/admin/tenants", json=body)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def create_key(self, tenant_id: str, **fields: Any) -> str:
        response = self.admin.post("/admin/keys", json={"tenant_id": tenant_id, **fields})
        assert response.status_code == 201, response.text
        return str(response.json()["key"])

    def new_key(self, models: list[str] | None = None, **fields: Any) -> str:
        """A fresh tenant and a key for it."""
        return self.create_key(self.create_tenant(models, **fields)["id"])


@contextmanager
def process_group() -> Iterator[ProcessGroup]:
    group = ProcessGroup()
    try:
        yield group
    finally:
        group.stop_all(grace_s=5)


def wait_until(predicate: Any, timeout_s: float = 5.0, interval_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
