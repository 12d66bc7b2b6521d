"""Gateways and workers on a real Redis Cluster (``redis+cluster://``): three primaries with a
replica each on loopback, created with ``redis-cli --cluster create``.

Two gateways and four simulated workers share it: workers join by heartbeat and their KV events
feed the exact prefix index, tenants and keys made through one gateway work through the other,
quotas hold across both, and a revocation reaches the other at once. Then a primary is killed
under load: its replica is promoted, the gateway follows, no request is refused and no lease is
left behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from redis.cluster import RedisCluster

from gateway.cli.localproc import (
    ProcessGroup,
    free_port_range,
    python_module_argv,
    start_redis_cluster,
    wait_http,
)
from tests.fleet import ADMIN_TOKEN, Engine, Gateway, wait_until
from tests.fleet import MODEL as MOCK_MODEL

SIM_MODEL = "switchyard-sim"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ProcessGroup, str, list[int]]]:
    """Three primaries with a replica each: for the failover tests."""
    with ProcessGroup(log_dir=tmp_path) as group:
        url, ports = start_redis_cluster(group, tmp_path, primaries=3, replicas=1)
        yield group, url, ports


@pytest.fixture
def primaries(tmp_path: Path) -> Iterator[tuple[ProcessGroup, str, list[int]]]:
    """Three primaries, no replicas: quicker to start, for the tests that kill no node."""
    with ProcessGroup(log_dir=tmp_path) as group:
        url, ports = start_redis_cluster(group, tmp_path, primaries=3, replicas=0)
        yield group, url, ports


def _chat(gateway: Gateway, key: str, model: str, system: str = "s",
          question: str = "hi") -> httpx.Response:
    return httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "max_tokens": 2, "messages": [
                          {"role": "system", "content": system},
                          {"role": "user", "content": question}]})


def _keys_per_primary(ports: list[int]) -> list[int]:
    sizes = []
    for port in ports:
        node = redis.Redis(port=port, socket_timeout=1)
        if node.info("replication")["role"] == "master":
            sizes.append(int(node.dbsize()))
    return sizes


def _fleet_names(gateway: Gateway) -> set[str]:
    body: Any = gateway.admin.get("/admin/fleet").json()
    return {b["name"] for b in body["data"] if b["is_healthy"]}


def test_two_gateways_and_a_fleet_share_one_cluster(
        primaries: tuple[ProcessGroup, str, list[int]], tmp_path: Path) -> None:
    group, url, ports = primaries
    base = free_port_range(4)
    group.spawn("sim", python_module_argv(
        "backends.sim", "--workers", "4", "--base-port", str(base), "--tokenizer", "approx",
        "--heartbeat-interval-s", "0.2", "--redis-url", url))
    for i in range(4):
        wait_http(f"http://127.0.0.1:{base + i}/health", group=group)
    routing = {"profile": "prefix_affinity", "tokenizers": {SIM_MODEL: "approx"}}
    first = Gateway(group, tmp_path, url, backends=[], routing=routing)
    second = Gateway(group, tmp_path, url, backends=[], routing=routing)
    # Membership: every worker's heartbeat (one key per worker, in its own slot) is read.
    for gateway in (first, second):
        assert wait_until(lambda g=gateway: len(_fleet_names(g)) == 4, timeout_s=15), \
            _fleet_names(gateway)

    tenant = first.create_tenant(limits={"requests_per_minute": 10})
    key = first.create_key(tenant["id"])
    made = first.admin.post("/admin/keys", json={"tenant_id": tenant["id"]})
    assert made.status_code == 201, made.text
    other_key, other_id = made.json()["key"], made.json()["id"]
    listed = first.admin.get("/admin/keys", params={"tenant_id": tenant["id"]}).json()
    assert len(listed["data"]) == 2, listed
    assert tenant["id"] in {t["id"] for t in second.admin.get("/admin/tenants").json()["data"]}
    # The state is spread over the primaries, so the operations above crossed slots and nodes.
    assert sum(1 for size in _keys_per_primary(ports) if size > 0) >= 2, \
        _keys_per_primary(ports)

    # Quotas hold across both gateways: 10 requests a minute in all, never more.
    statuses = [_chat(g, key, SIM_MODEL).status_code for _ in range(7) for g in (first, second)]
    assert statuses.count(200) == 10 and statuses.count(429) == 4, statuses

    # A revocation through one gateway is seen by the other within a second (pub/sub).
    unlimited = first.new_key(limits={"requests_per_minute": 100_000})
    assert _chat(second, unlimited, SIM_MODEL).status_code == 200
    assert _chat(second, other_key, SIM_MODEL).status_code == 429  # cached, and at its limit
    assert first.admin.delete(f"/admin/keys/{other_id}").status_code == 200
    start = time.monotonic()
    assert wait_until(lambda: _chat(second, other_key, SIM_MODEL).status_code == 401,
                      timeout_s=1.0)
    assert time.monotonic() - start < 1.0

    # KV events from every worker's stream (each in its own slot) feed the exact index. Each
    # prompt is sent straight to one worker, past both gateways: only that worker's KV events
    # can tell them where it is cached.
    systems = [f"group {i}: " + "a long shared system prompt " * 40 for i in range(4)]
    for i, system in enumerate(systems):
        direct = httpx.post(f"http://127.0.0.1:{base + i}/v1/chat/completions", timeout=30,
                            json={"model": SIM_MODEL, "max_tokens": 2, "messages": [
                                {"role": "system", "content": system},
                                {"role": "user", "content": "warm up"}]})
        assert direct.status_code == 200, direct.text
    time.sleep(1.5)  # the events reach both gateways
    for i, system in enumerate(systems):
        for gateway in (first, second):
            response = _chat(gateway, unlimited, SIM_MODEL, system, f"question {i}")
            assert response.status_code == 200, response.text
            assert response.headers["x-switchyard-backend"] == f"sim-{base + i}"
            assert response.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 100


def _primary_ports(ports: list[int]) -> list[int]:
    found = []
    for port in ports:
        try:
            if redis.Redis(port=port, socket_timeout=1).info("replication")["role"] == "master":
                found.append(port)
        except redis.RedisError:
            continue
    return found


def _fallback_count(gateway: Gateway) -> float:
    """Quota checks answered without Redis so far (failed open or closed)."""
    metrics = httpx.get(gateway.url + "/metrics", timeout=5).text
    return sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith(("switchyard_quota_fail_open_total",
                                   "switchyard_quota_fail_closed_total")))


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_a_primary_fails_over_under_load(cluster: tuple[ProcessGroup, str, list[int]],
                                         tmp_path: Path, fail_mode: str) -> None:
    """Open: every request is admitted through the failover. Closed: a limited tenant's
    requests get 503 with Retry-After while its quota's primary is away, and none after."""
    group, url, ports = cluster
    engine = Engine(group, "cluster-engine")
    gateway = Gateway(group, tmp_path, url, [engine.backend_config()],
                      admission={"fail_mode": fail_mode})
    # max_concurrent 1, used one request at a time: a lease left behind refuses the next.
    key = gateway.new_key(limits={"requests_per_minute": 100_000, "max_concurrent": 1})
    assert _chat(gateway, key, MOCK_MODEL).status_code == 200
    # The primary that holds this tenant's quota keys is the one to kill.
    client = RedisCluster(host="127.0.0.1", port=ports[0])
    keys: Any = client.keys("sy:tenant:*", target_nodes=client.PRIMARIES)
    tenant_slot_key = next(k for k in keys if not k.endswith(b":keys"))
    victim: Any = client.get_node_from_key(tenant_slot_key)  # type: ignore[no-untyped-call]
    assert victim is not None
    statuses: list[int] = []
    refusals: list[httpx.Response] = []
    stop = threading.Event()

    def load() -> None:  # bounded: until stopped, and at most 2,000 requests
        while not stop.is_set() and len(statuses) < 2000:
            response = _chat(gateway, key, MOCK_MODEL)
            statuses.append(response.status_code)
            if response.status_code != 200:
                refusals.append(response)
            time.sleep(0.005)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        time.sleep(0.5)
        pid = int(redis.Redis(port=victim.port).info()["process_id"])
        os.kill(pid, signal.SIGKILL)
        survivors = [p for p in ports if p != victim.port]
        assert wait_until(lambda: len(_primary_ports(survivors)) == 3, timeout_s=20)
        # Load on the promoted replica until the quota store answers from Redis again: five
        # requests in a row admitted while neither fallback counter moved (bounded).
        fallbacks = [_fallback_count(gateway)]

        def answered_by_redis() -> bool:
            fallbacks.append(_fallback_count(gateway))
            return statuses[-5:] == [200] * 5 and len(fallbacks) >= 3 \
                and fallbacks[-1] == fallbacks[-3]

        recovered = wait_until(answered_by_redis, timeout_s=20, interval_s=0.1)
    finally:
        stop.set()
        loader.join(timeout=30)
    assert recovered, (statuses[-20:], fallbacks[-5:])
    assert fallbacks[-1] >= 1  # the failover window did send requests to the fallback
    if fail_mode == "open":
        assert len(statuses) >= 10 and set(statuses) == {200}, sorted(set(statuses))
    else:
        assert statuses.count(200) >= 10 and set(statuses) <= {200, 503}, sorted(set(statuses))
        assert all(r.headers.get("Retry-After") and r.json()["error"]["message"]
                   for r in refusals), [(r.headers, r.text) for r in refusals[:3]]
    # No lease was left behind: the same one-at-a-time key is admitted every time.
    assert [_chat(gateway, key, MOCK_MODEL).status_code for _ in range(10)] == [200] * 10

    def fresh_key_works() -> bool:
        try:
            return _chat(gateway, gateway.new_key(limits={"requests_per_minute": 2}),
                         MOCK_MODEL).status_code == 200
        except AssertionError:  # the admin API's write still on its way to the new primary
            return False

    assert wait_until(fresh_key_works, timeout_s=15)
    limited = gateway.new_key(limits={"requests_per_minute": 2})
    assert [_chat(gateway, limited, MOCK_MODEL).status_code for _ in range(3)] == [200, 200, 429]


def test_a_bad_cluster_url_is_a_config_error(tmp_path: Path) -> None:
    from gateway.settings import ConfigError, load_settings

    config = tmp_path / "bad.yaml"
    config.write_text("redis_url: redis+cluster://127.0.0.1:7000/3\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    assert "only database 0" in str(info.value)


def test_a_cluster_out_of_reach_is_a_clear_503(tmp_path: Path) -> None:
    """Every node down: the gateway stays up, says so on /readyz, and answers 503s that name the
    state store; its background tasks keep retrying (a cluster client's "no node reachable"
    is not a redis-py RedisError)."""
    from gateway.cli.localproc import _cluster_port, free_port

    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "listen": {"host": "127.0.0.1", "port": port}, "admin_token": ADMIN_TOKEN,
        "redis_url": f"redis+cluster://127.0.0.1:{_cluster_port()}", "log_level": "warning"}))
    with ProcessGroup(log_dir=tmp_path) as group:
        process = group.spawn("gateway", python_module_argv(
            "gateway", "serve", "--config", str(config)))
        wait_http(f"http://127.0.0.1:{port}/healthz", group=group)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert ready.status_code == 503 and "Redis unreachable" in ready.text, ready.text
        admin = httpx.get(f"http://127.0.0.1:{port}/admin/tenants", timeout=10,
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert admin.status_code == 503, admin.text
        assert admin.json()["error"]["code"] == "state_store_unavailable"
        chat = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=10,
                          headers={"Authorization": "Bearer sy-0123456789abcdef-" + "k" * 43},
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 503, chat.text
        time.sleep(1.5)  # the background tasks' first retries
        assert process.poll() is None
        log_text = (tmp_path / "gateway.log").read_text()
        assert "Traceback" not in log_text and "failed:" not in log_text, log_text[-2000:]
