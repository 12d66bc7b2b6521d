"""The fuzzed fleet: a real gateway with Redis in front of a real simulated engine, on
loopback, and credentials of every kind."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    python_module_argv,
    start_redis,
    wait_http,
)
from tests.fleet import ADMIN_TOKEN, Gateway
from tests.fuzz.http_cases import Credentials

MODEL = "switchyard-sim"


@dataclass(frozen=True)
class Fleet:
    gateway: Gateway
    credentials: Credentials
    workdir: Path


def _credentials(gateway: Gateway) -> Credentials:
    admin = gateway.admin
    disabled = gateway.create_tenant()
    disabled_key = gateway.create_key(disabled["id"])
    admin.delete(f"/admin/tenants/{disabled['id']}").raise_for_status()
    revoked_key = gateway.new_key()
    admin.delete(f"/admin/keys/{revoked_key[3:19]}").raise_for_status()
    victims = [gateway.create_tenant() for _ in range(2)]
    victim_keys = [gateway.create_key(t["id"]) for t in victims]
    return Credentials(
        tenant_key=gateway.new_key(), restricted_key=gateway.new_key(models=["not-served"]),
        disabled_key=disabled_key, revoked_key=revoked_key,
        limited_key=gateway.new_key(limits={"requests_per_minute": 3}),
        admin_token=ADMIN_TOKEN, models=(MODEL,),
        tenant_ids=tuple(t["id"] for t in victims), key_ids=tuple(k[3:19] for k in victim_keys),
    )


@pytest.fixture(scope="package")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("fuzz")
    with ProcessGroup(log_dir=workdir) as group:
        redis_url = start_redis(group, workdir)
        port = free_port()
        group.spawn("sim", python_module_argv(
            "backends.sim", "--workers", "1", "--base-port", str(port), "--model", MODEL,
            "--tokenizer", "approx", "--max-context-tokens", "1024", "--speed-factor", "50"))
        sim_url = f"http://127.0.0.1:{port}"
        wait_http(sim_url + "/health", group=group)
        gateway = Gateway(group, workdir, redis_url,
                          [{"name": "sim-0", "url": sim_url, "models": [MODEL]}],
                          routing={"tokenizers": {MODEL: "approx"}, "discover_workers": False},
                          upstream={"health_timeout_s": 2.0})
        yield Fleet(gateway, _credentials(gateway), workdir)


