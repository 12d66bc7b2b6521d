"""A gateway on a Sentinel-managed Redis (``redis+sentinel://``): a real primary, a real
replica and a real sentinel on loopback. The primary is killed under load: the sentinel
promotes the replica, the gateway follows it without a restart, no request is refused for it
(quotas fail open meanwhile), and tenants, keys and quotas written before and after work."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from gateway.cli.localproc import ProcessGroup, free_port, redis_server_path, start_redis
from tests.fleet import MODEL, Engine, Gateway, wait_until

SERVICE = "switchyard"


def _sentinel(group: ProcessGroup, workdir: Path, primary_port: int) -> int:
    port = free_port()
    conf = workdir / f"sentinel-{port}.conf"  # the sentinel rewrites it: its own file
    conf.write_text("\n".join([
        f"port {port}", "bind 127.0.0.1", f"dir {workdir}",
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 1",
        f"sentinel down-after-milliseconds {SERVICE} 800",
        f"sentinel failover-timeout {SERVICE} 4000", ""]))
    group.spawn(f"sentinel-{port}", [redis_server_path(), str(conf), "--sentinel"])
    client = redis.Redis(port=port, socket_timeout=1)
    assert wait_until(lambda: _answers(client), timeout_s=10)
    return port


def _answers(client: redis.Redis) -> bool:
    with contextlib.suppress(redis.RedisError):
        return bool(client.ping())
    return False


def _primary_port(sentinel_port: int) -> int | None:
    with contextlib.suppress(redis.RedisError):
        found = redis.Redis(port=sentinel_port, socket_timeout=1).execute_command(
            "SENTINEL", "get-master-addr-by-name", SERVICE)
        return int(found[1]) if found else None
    return None


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Gateway, int, int]]:
    with ProcessGroup(log_dir=tmp_path) as group:
        primary_url = start_redis(group, tmp_path)
        primary_port = int(primary_url.rsplit(":", 1)[1].split("/")[0])
        replica_port = free_port()
        start_redis(group, tmp_path, replica_port)
        replica = redis.Redis(port=replica_port, socket_timeout=1)
        replica.execute_command("REPLICAOF", "127.0.0.1", str(primary_port))
        assert wait_until(lambda: replica.info("replication").get("master_link_status")
                          == "up", timeout_s=10)
        sentinel_port = _sentinel(group, tmp_path, primary_port)
        assert wait_until(lambda: _primary_port(sentinel_port) == primary_port, timeout_s=10)
        engine = Engine(group, "sentinel-engine")
        gateway = Gateway(group, tmp_path, f"redis+sentinel://127.0.0.1:{sentinel_port}/"
                          f"{SERVICE}/0", [engine.backend_config()])
        yield gateway, sentinel_port, replica_port


def _chat(gateway: Gateway, key: str) -> int:
    return httpx.post(gateway.url + "/v1/chat/completions", timeout=15,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": MODEL, "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hi"}]}).status_code


def test_the_gateway_follows_a_failover_under_load(fleet: tuple[Gateway, int, int]) -> None:
    gateway, sentinel_port, replica_port = fleet
    key = gateway.new_key(limits={"requests_per_minute": 100_000, "max_concurrent": 64})
    assert _chat(gateway, key) == 200
    statuses: list[int] = []
    stop = threading.Event()

    def load() -> None:  # bounded: until stopped, and at most 2,000 requests
        while not stop.is_set() and len(statuses) < 2000:
            statuses.append(_chat(gateway, key))
            time.sleep(0.005)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        time.sleep(0.5)
        primary_pid = int(redis.Redis(port=_primary_port(sentinel_port) or 0).info()[
            "process_id"])
        os.kill(primary_pid, signal.SIGKILL)
        assert wait_until(lambda: _primary_port(sentinel_port) == replica_port, timeout_s=20)
        time.sleep(1.0)  # load on the new primary
    finally:
        stop.set()
        loader.join(timeout=30)
    assert statuses and set(statuses) == {200}, sorted(set(statuses))
    # Written after the failover, on the new primary, and used at once.
    def fresh_key_works() -> bool:
        try:
            return _chat(gateway, gateway.new_key(limits={"requests_per_minute": 2})) == 200
        except AssertionError:  # the admin API's write still on its way to the new primary
            return False

    assert wait_until(fresh_key_works, timeout_s=15)
    limited = gateway.new_key(limits={"requests_per_minute": 2})
    assert [_chat(gateway, limited) for _ in range(3)] == [200, 200, 429]


def test_a_bad_sentinel_url_is_a_config_error(tmp_path: Path) -> None:
    from gateway.settings import ConfigError, load_settings

    config = tmp_path / "bad.yaml"
    config.write_text("redis_url: redis+sentinel://127.0.0.1:26379\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    assert "name the monitored service" in str(info.value)
    assert f"{config}:1" in str(info.value)
