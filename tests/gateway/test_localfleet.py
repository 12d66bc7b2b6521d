"""`LocalFleet` with real processes on loopback: a private Redis, simulated and mock engines,
gateways sharing one admin token and key secret, and the errors a failed start reports."""

from __future__ import annotations

import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from gateway.cli.localfleet import MOCK_MODEL, SIM_MODEL, GatewayProc, LocalFleet
from gateway.cli.localproc import Stopped, wait_http

HEARTBEAT_FLAGS = ("--heartbeat-interval-s", "0.2")


def _backends(gateway: GatewayProc, admin_token: str) -> list[dict[str, Any]]:
    response = httpx.get(gateway.url + "/admin/fleet", timeout=5,
                         headers={"Authorization": f"Bearer {admin_token}"})
    response.raise_for_status()
    return list(response.json()["data"])


def _healthy_backends(gateway: GatewayProc, admin_token: str, count: int,
                      timeout_s: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        healthy = [b for b in _backends(gateway, admin_token) if b.get("is_healthy")]
        if len(healthy) >= count or time.monotonic() > deadline:
            return healthy
        time.sleep(0.1)


def _chat(gateway: GatewayProc, key: str, model: str) -> httpx.Response:
    return httpx.post(gateway.url + "/v1/chat/completions", timeout=10,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hello there"}]})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    with LocalFleet(tmp_path_factory.mktemp("localfleet"), grace_s=5) as running:
        yield running


@pytest.fixture(scope="module")
def sim_urls(fleet: LocalFleet) -> list[str]:
    return fleet.start_sims(2, flags=HEARTBEAT_FLAGS, health_timeout_s=30)


@pytest.fixture(scope="module")
def sim_gateway(fleet: LocalFleet, sim_urls: list[str]) -> GatewayProc:
    return fleet.start_gateway({"backends": [], "log_level": "warning"})


def test_simulated_workers_join_the_gateway_and_serve_a_chat_completion(
        fleet: LocalFleet, sim_urls: list[str], sim_gateway: GatewayProc) -> None:
    backends = _healthy_backends(sim_gateway, fleet.admin_token, 2)
    assert sorted(b["url"] for b in backends) == sorted(sim_urls)
    assert {b["source"] for b in backends} == {"heartbeat"}
    key = fleet.create_tenant_key(sim_gateway.url, {"name": "test", "models": ["*"]},
                                  name="test")
    response = _chat(sim_gateway, key, SIM_MODEL)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 2


def test_the_gateway_config_holds_the_fleet_secrets_and_only_this_user_reads_it(
        fleet: LocalFleet, sim_gateway: GatewayProc) -> None:
    path = fleet.workdir / "gateway.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = yaml.safe_load(path.read_text())
    port = int(sim_gateway.url.rsplit(":", 1)[1])
    assert config == {
        "listen": {"host": "127.0.0.1", "port": port}, "redis_url": fleet.redis_url,
        "admin_token": fleet.admin_token, "key_secret": fleet.key_secret,
        "backends": [], "log_level": "warning",
    }
    assert sim_gateway.log_path == fleet.workdir / "gateway.log"


def test_pids_name_every_child_by_its_role(fleet: LocalFleet, sim_gateway: GatewayProc) -> None:
    pids = fleet.pids()
    assert {"redis", "sim", "gateway"} <= set(pids)
    assert pids["gateway"] == sim_gateway.pid
    assert redis.Redis.from_url(fleet.redis_url).ping()


def test_listed_mocks_serve_through_a_second_gateway_that_shares_the_keys(
        fleet: LocalFleet, sim_gateway: GatewayProc) -> None:
    urls = fleet.start_mocks(["mock-a", "mock-b"], flags=["--token-delay-ms", "0"])
    second = fleet.start_gateway({
        "backends": [{"name": f"mock-{i}", "url": url, "models": [MOCK_MODEL]}
                     for i, url in enumerate(urls)],
        "log_level": "warning",
    }, name="gateway-mocks")
    # Listed, beside the simulated workers it meets through the shared Redis.
    listed = {b["url"] for b in _healthy_backends(second, fleet.admin_token, 4)
              if b["source"] == "config"}
    assert listed == set(urls)
    tenant = {"id": "shared", "name": "Shared", "models": ["*"]}
    first_key = fleet.create_tenant_key(sim_gateway.url, tenant, name="one")
    # The tenant exists now (same Redis); with is_existing_ok it gets a second key.
    second_key = fleet.create_tenant_key(second.url, tenant, is_existing_ok=True, name="two")
    assert first_key != second_key
    for key in (first_key, second_key):
        assert _chat(second, key, MOCK_MODEL).status_code == 200
    with pytest.raises(RuntimeError, match="cannot create tenant shared"):
        fleet.create_tenant_key(second.url, tenant)


def test_a_gateway_that_cannot_start_reports_its_log(fleet: LocalFleet) -> None:
    with pytest.raises(RuntimeError) as failure:
        fleet.start_gateway({"backends": "not a list"}, name="broken", ready_timeout_s=15)
    message = str(failure.value)
    assert "broken (exit status" in message and "--- broken.log ---" in message
    assert "backends" in message.partition("--- broken.log ---")[2]


def test_serving_ends_when_a_stop_is_asked_for_or_a_child_stops_on_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with LocalFleet(tmp_path, redis_url="redis://127.0.0.1:1/0", grace_s=1) as fleet:
        assert fleet.pids() == {}  # a Redis given is not started
        assert fleet.serve_until_stopped(lambda: True, "the test fleet") == 0
        assert "stopping the test fleet ..." in capsys.readouterr().out
        fleet.group.spawn("quitter", [sys.executable, "-c", "raise SystemExit(0)"])
        assert fleet.serve_until_stopped(lambda: False, "the test fleet", interval_s=0.05) == 1
        assert f"quitter (exit status 0) stopped unexpectedly; logs in {tmp_path}" \
            in capsys.readouterr().out


@pytest.mark.parametrize(("is_stopped", "error"), [
    pytest.param(lambda: True, Stopped, id="stop-asked-for"),
    pytest.param(lambda: False, RuntimeError, id="timeout"),
])
def test_wait_http_stops_when_asked(is_stopped: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        wait_http("http://127.0.0.1:1/health", timeout_s=0.2, is_stopped=is_stopped)
