"""Usage accounting end to end: two gateway replicas on one Redis charge what the engine
reported, exactly; GET /admin/usage, `switchyard usage` and the per-tenant Prometheus counters
agree; refused and failed requests cost nothing; bad queries get a 400 that says what to send."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import httpx
import pytest

from gateway.cli.localproc import ProcessGroup, python_module_argv, start_redis
from tests.fleet import ADMIN_TOKEN, MODEL, Engine, Gateway, wait_until

PRICES = {MODEL: {"prompt": 2.0, "cached": 1.0, "output": 10.0}}


def _chat(gateway: Gateway, key: str, *, stream: bool, words: int) -> tuple[int, dict[str, int]]:
    """One request; the usage the engine reported for it (asked for on streams too)."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 3 + words % 4,
                            "messages": [{"role": "user", "content": " ".join(["w"] * words)}]}
    headers = {"Authorization": f"Bearer {key}"}
    if not stream:
        response = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers,
                              timeout=10)
        return response.status_code, response.json().get("usage", {})
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    usage: dict[str, int] = {}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body,
                      headers=headers, timeout=10) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
        return response.status_code, usage


def _metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            inside = line[len(name) + 1:line.index("}")]
            if ",".join(sorted(inside.split(","))) == wanted:
                return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("usage")
    with ProcessGroup() as group:
        redis_url = start_redis(group, workdir)
        engine = Engine(group, "engine")
        gateways = [Gateway(group, workdir, redis_url, [engine.backend_config()],
                            usage={"prices": PRICES, "flush_interval_s": 0.2})
                    for _ in range(2)]
        yield gateways


def test_two_replicas_charge_exactly_what_the_engine_reported(replicas: list[Gateway]) -> None:
    first, second = replicas
    tenant = first.create_tenant()
    keys = [first.create_key(tenant["id"]), first.create_key(tenant["id"])]
    reported = []
    for index in range(24):
        gateway = replicas[index % 2]
        status, usage = _chat(gateway, keys[index // 12], stream=index % 3 == 0, words=index + 1)
        assert status == 200 and usage["prompt_tokens"] > 0
        reported.append((index // 12, usage))
    # Refused or failed before a backend answered: not charged.
    bad = httpx.post(first.url + "/v1/chat/completions", timeout=10,
                     headers={"Authorization": f"Bearer {keys[0]}"},
                     json={"model": MODEL, "max_tokens": -1, "messages": []})
    assert bad.status_code == 400

    def page(gateway: Gateway, **query: str) -> dict[str, Any]:
        response = gateway.admin.get("/admin/usage", params={"tenant": tenant["id"], **query})
        assert response.status_code == 200, response.text
        return dict(response.json())

    # The other replica's charges arrive with its next flush (every 0.2 s here).
    assert wait_until(lambda: page(second)["total"]["requests"] == 24, timeout_s=5)
    total = page(first)["total"]
    prompt = sum(u["prompt_tokens"] for _, u in reported)
    cached = sum(u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for _, u in reported)
    output = sum(u["completion_tokens"] for _, u in reported)
    assert (total["requests"], total["prompt_tokens"], total["cached_tokens"],
            total["output_tokens"]) == (24, prompt, cached, output)
    expected_cost = ((prompt - cached) * 2.0 + cached * 1.0 + output * 10.0) / 1e6
    assert total["cost"] == pytest.approx(expected_cost) and total["currency"] == "USD"

    by_key = page(first)["data"]
    assert len(by_key) == 2 and {row["requests"] for row in by_key} == {12}
    assert all(keys[0] not in json.dumps(row) for row in by_key)  # key ids, never keys
    by_model = page(second, group_by="model")["data"]
    assert [(row["model"], row["key_id"], row["requests"]) for row in by_model] == [
        (MODEL, "*", 24)]

    # Each replica's Prometheus counters hold its own share; together, all of it.
    scraped = [httpx.get(g.url + "/metrics", timeout=5).text for g in replicas]
    labels = {"tenant": tenant["id"], "model": MODEL}
    assert sum(_metric(text, "switchyard_tenant_tokens_total", kind="prompt", **labels)
               for text in scraped) == prompt
    assert sum(_metric(text, "switchyard_tenant_tokens_total", kind="output", **labels)
               for text in scraped) == output
    assert sum(_metric(text, "switchyard_tenant_cost_total", currency="USD", **labels)
               for text in scraped) == pytest.approx(expected_cost)
    for text in scraped:  # every charge is in Redis, none failed or was dropped
        lines = dict(line.rsplit(" ", 1) for line in text.splitlines()
                     if line.startswith("switchyard_usage_"))
        assert float(lines["switchyard_usage_unsent_fields"]) == 0
        assert float(lines["switchyard_usage_flush_failures_total"]) == 0
        assert float(lines["switchyard_usage_dropped_fields_total"]) == 0


def test_switchyard_usage_prints_the_table_and_the_json(replicas: list[Gateway]) -> None:
    gateway = replicas[0]
    tenant_id = gateway.create_tenant()["id"]
    key = gateway.create_key(tenant_id)
    assert _chat(gateway, key, stream=False, words=5)[0] == 200
    argv = python_module_argv("gateway", "usage", "--url", gateway.url, "--tenant", tenant_id,
                              "--group-by", "model")
    env = {"SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN, "PATH": "/usr/bin:/bin"}
    table = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "cost (USD)" in lines[1] and lines[-1].startswith("total")
    row = next(line for line in lines if line.startswith(tenant_id))
    assert row.split()[1:4] == ["*", MODEL, "1"]
    as_json = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=30,
                             env=env)
    assert json.loads(as_json.stdout)["total"]["requests"] == 1
    refused = subprocess.run([*argv, "--from", "yesterday"], capture_output=True, text=True,
                             timeout=30, env=env)
    assert refused.returncode == 1 and "ISO 8601" in refused.stderr


@pytest.mark.parametrize(("query", "status", "param"), [
    ({"from": "not-a-time"}, 400, "from"),
    ({"from": "2026-12-03T10:00:00Z", "to": "2026-12-03T09:00:00Z"}, 400, "from"),
    ({"to": "1e300"}, 400, "to"),
    ({"from": "2000-01-01", "to": "2026-01-01"}, 400, "from"),
    ({"group_by": "colour"}, 400, "group_by"),
    ({"tenant": "no-such-tenant"}, 404, "tenant_id"),
])
def test_bad_usage_queries_say_what_to_send(replicas: list[Gateway], query: dict[str, str],
                                            status: int, param: str) -> None:
    response = replicas[0].admin.get("/admin/usage", params=query)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]


def test_usage_needs_the_admin_token(replicas: list[Gateway]) -> None:
    key = replicas[0].new_key()
    for headers in ({}, {"Authorization": f"Bearer {key}"}):
        response = httpx.get(replicas[0].url + "/admin/usage", headers=headers, timeout=5)
        assert response.status_code in (401, 403)
        assert response.json()["error"]["code"] in ("invalid_admin_token", "not_admin")


def test_iso_dates_and_unix_seconds_name_the_same_range(replicas: list[Gateway]) -> None:
    now = int(time.time())
    by_seconds = replicas[0].admin.get("/admin/usage", params={"from": now - 7200, "to": now})
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 7200))
    end = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now))
    by_iso = replicas[0].admin.get("/admin/usage", params={"from": start, "to": end})
    assert by_seconds.status_code == by_iso.status_code == 200
    assert (by_seconds.json()["from"], by_seconds.json()["to"]) == (
        by_iso.json()["from"], by_iso.json()["to"])
    assert by_seconds.json()["to"].endswith(":00:00Z")  # widened to whole hours
