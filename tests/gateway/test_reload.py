"""Configuration reload through a real gateway process: POST /admin/reload and SIGHUP apply
backends, aliases, tiers' SLOs and the routing profile live; an invalid file changes nothing and
says where it is wrong; a reload under load fails no request."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.cli.localproc import ProcessGroup
from tests.fleet import Engine, Gateway, wait_until


@pytest.fixture
def fleet(workdir: Path, redis_url: str) -> Iterator[tuple[Gateway, list[Engine]]]:
    with ProcessGroup() as group:
        engines = [Engine(group, f"reload-{name}", models=(name,)) for name in ("m1", "m2")]
        gateway = Gateway(group, workdir, redis_url, [engines[0].backend_config()],
                          routing={"discover_workers": False})
        yield gateway, engines


def _config(gateway: Gateway) -> dict[str, Any]:
    return dict(yaml.safe_load(gateway.config_path.read_text()))


def _write(gateway: Gateway, config: dict[str, Any]) -> None:
    gateway.config_path.write_text(yaml.safe_dump(config))


def _chat(gateway: Gateway, key: str, model: str) -> httpx.Response:
    return httpx.post(gateway.url + "/v1/chat/completions", timeout=10,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "max_tokens": 2,
                            "messages": [{"role": "user", "content": "reload me"}]})


def test_backends_aliases_and_tiers_change_live(fleet: tuple[Gateway, list[Engine]]) -> None:
    gateway, engines = fleet
    key = gateway.new_key()
    assert _chat(gateway, key, "m2").status_code == 404  # not served yet
    config = _config(gateway)
    config["backends"].append(engines[1].backend_config())
    config["aliases"] = [{"name": "chat", "targets": ["m2"]}]
    config["tiers"] = [{"name": "interactive", "priority": 0, "ttft_slo_ms": 800,
                        "on_overload": "reject"},
                       {"name": "standard", "priority": 1, "ttft_slo_ms": 3000},
                       {"name": "batch", "priority": 2, "ttft_slo_ms": 90000,
                        "on_overload": "queue"}]
    config["listen"] = {**config["listen"], "keepalive_timeout_s": 5.0}
    _write(gateway, config)
    answer = gateway.admin.post("/admin/reload")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"reloaded": True, "applied": ["backends", "aliases", "tiers"],
                             "needs_restart": ["listen"]}
    served = _chat(gateway, key, "chat")
    assert served.status_code == 200, served.text
    assert served.headers["x-switchyard-model"] == "m2"
    fleet_doc = gateway.admin.get("/admin/fleet").json()
    assert sorted(b["name"] for b in fleet_doc["data"]) == ["reload-m1", "reload-m2"]
    # Unchanged again: nothing to apply.
    assert gateway.admin.post("/admin/reload").json()["applied"] == []


def test_a_listed_backends_stated_profile_changes_live(
        fleet: tuple[Gateway, list[Engine]]) -> None:
    gateway, _ = fleet
    config = _config(gateway)
    config["backends"][0]["profile"] = {"max_batch": 7}
    _write(gateway, config)
    answer = gateway.admin.post("/admin/reload")
    assert answer.status_code == 200, answer.text
    assert answer.json()["applied"] == ["backends"]
    (backend,) = gateway.admin.get("/admin/fleet").json()["data"]
    assert backend["profile"]["max_batch"] == {"value": 7, "source": "config"}


def test_an_invalid_file_changes_nothing_and_says_where(
        fleet: tuple[Gateway, list[Engine]]) -> None:
    gateway, _ = fleet
    key = gateway.new_key()
    good = gateway.config_path.read_text()
    gateway.config_path.write_text(good + "aliases:\n  - {name: chat, targets: [m1]}\n"
                                          "  - {name: chat, targets: [m1]}\n")
    answer = gateway.admin.post("/admin/reload")
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "invalid_config"
    assert re.search(rf"{re.escape(str(gateway.config_path))}:\d+: aliases\[1\]\.name",
                     error["message"]), error["message"]
    assert _chat(gateway, key, "chat").status_code == 404  # the alias did not arrive
    assert _chat(gateway, key, "m1").status_code == 200
    tenant = gateway.new_key()  # a tenant key is not the admin token
    refused = httpx.post(gateway.url + "/admin/reload", timeout=10,
                         headers={"Authorization": f"Bearer {tenant}"})
    assert refused.status_code in (401, 403)


def test_new_tiers_wait_for_a_restart_and_the_rest_applies(
        fleet: tuple[Gateway, list[Engine]]) -> None:
    gateway, _ = fleet
    key = gateway.new_key()
    config = _config(gateway)
    config["tiers"] = [{"name": "gold", "priority": 0, "ttft_slo_ms": 300},
                       {"name": "standard", "priority": 1, "ttft_slo_ms": 2000}]
    config["default_tier"] = "gold"
    config["aliases"] = [{"name": "chat", "targets": ["m1"]}]
    _write(gateway, config)
    answer = gateway.admin.post("/admin/reload")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"reloaded": True, "applied": ["aliases"], "needs_restart": [
        "tiers (their names or priorities)", "default_tier"]}
    assert _chat(gateway, key, "chat").status_code == 200
    created = gateway.create_tenant()
    assert created["tier"] == "standard"  # the default tier it runs on, not the new file's


def test_sighup_reloads(fleet: tuple[Gateway, list[Engine]]) -> None:
    gateway, _ = fleet
    key = gateway.new_key()
    config = _config(gateway)
    config["aliases"] = [{"name": "by-signal", "targets": ["m1"]}]
    _write(gateway, config)
    gateway.process.send_signal(signal.SIGHUP)
    assert wait_until(lambda: _chat(gateway, key, "by-signal").status_code == 200,
                      timeout_s=10)
    assert gateway.process.poll() is None  # still serving


def test_reloads_under_load_fail_no_request(fleet: tuple[Gateway, list[Engine]]) -> None:
    gateway, engines = fleet
    key = gateway.new_key()
    base = _config(gateway)
    variants = []
    for index in range(6):
        config = yaml.safe_load(yaml.safe_dump(base))
        config["aliases"] = [{"name": "chat", "targets": ["m1"]}]
        if index % 2:
            config["backends"].append(engines[1].backend_config())
            config["aliases"][0]["targets"] = [{"model": "m1", "weight": 1},
                                               {"model": "m2", "weight": 1}]
        config["routing"] = {**config.get("routing", {}),
                             "profile": ("least_load", "prefix_affinity")[index % 2]}
        variants.append(config)
    _write(gateway, variants[0])
    assert gateway.admin.post("/admin/reload").status_code == 200
    statuses: list[int] = []

    async def load(stop_at: float) -> None:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30,
                                     headers={"Authorization": f"Bearer {key}"}) as client:
            async def one() -> None:
                while time.monotonic() < stop_at:
                    response = await client.post("/v1/chat/completions", json={
                        "model": "chat", "max_tokens": 2,
                        "messages": [{"role": "user", "content": "under load"}]})
                    statuses.append(response.status_code)

            await asyncio.gather(*(one() for _ in range(8)))

    async def run() -> None:
        stop_at = time.monotonic() + 4.0
        task = asyncio.create_task(load(stop_at))
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10, headers=dict(
                gateway.admin.headers)) as admin:
            for config in variants[1:] * 2:
                await asyncio.sleep(0.3)
                _write(gateway, config)
                reloaded = await admin.post("/admin/reload")
                assert reloaded.status_code == 200, reloaded.text
        await task

    asyncio.run(run())
    assert len(statuses) > 100
    assert set(statuses) == {200}, sorted(set(statuses))
    last = variants[1:][-1]["routing"]["profile"]
    assert gateway.admin.get("/admin/fleet").json()["routing_profile"] == last
