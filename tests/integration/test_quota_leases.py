"""Concurrency leases are never left held: not by a client that leaves while its acquire is on
its way to Redis, not by a gateway that shuts down with settles still queued."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest
import redis

from gateway.cli.localproc import ProcessGroup, start_redis
from tests.admission.held import held
from tests.fleet import Engine, Gateway

MODEL = "switchyard-mock"
BODY = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def _post(gateway: Gateway, key: str, timeout_s: float = 10.0) -> int:
    return httpx.post(gateway.url + "/v1/chat/completions", json=BODY, timeout=timeout_s,
                      headers={"Authorization": f"Bearer {key}"}).status_code


def test_a_client_leaving_during_its_acquire_holds_no_lease(tmp_path: Path) -> None:
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        redis_process = group.children[-1][1]
        engine = Engine(group, "engine")
        gateway = Gateway(group, tmp_path, redis_url, [engine.backend_config()],
                          admission={"redis_timeout_s": 5.0})
        tenant = gateway.create_tenant(limits={"max_concurrent": 2})
        key = gateway.create_key(tenant["id"])
        client = redis.Redis.from_url(redis_url)
        for _ in range(2):  # the key is cached (auth needs no Redis below), scripts loaded
            assert _post(gateway, key) == 200
        time.sleep(0.2)  # their settles have gone out
        assert held(client, tenant["id"]) == 0

        # Redis stalls; the client gives up while its acquire waits for the answer.
        redis_process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(httpx.ReadTimeout):
                _post(gateway, key, timeout_s=0.5)
            time.sleep(0.2)  # the gateway has seen the client leave
        finally:
            redis_process.send_signal(signal.SIGCONT)
        # Redis now grants the abandoned acquire its lease; the gateway must give it back
        # (not leave it held until the lease's TTL, a minute by default).
        counts = []
        for _ in range(20):
            counts.append(held(client, tenant["id"]))
            if counts[-1] == 0:
                break
            time.sleep(0.1)
        assert counts[-1] == 0, counts
        client.close()


def test_shutdown_settles_the_last_requests(tmp_path: Path) -> None:
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        engine = Engine(group, "engine")
        gateway = Gateway(group, tmp_path, redis_url, [engine.backend_config()])
        tenant = gateway.create_tenant(limits={"max_concurrent": 5})
        key = gateway.create_key(tenant["id"])
        client = redis.Redis.from_url(redis_url)
        assert _post(gateway, key) == 200
        # Its settle waits to ride with the next acquire; there is none: shut down now.
        gateway.terminate()
        assert gateway.process.wait(timeout=15) == 0
        assert held(client, tenant["id"]) == 0
        client.close()
