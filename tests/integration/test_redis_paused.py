"""Redis paused (SIGSTOP) then resumed: the quota acquires sent during the pause reach Redis
afterwards. They must leave no lease behind (a phantom lease locks a max_concurrent=1 tenant
out for lease_ttl_s), and the gateway is back on Redis within 2 s of it returning."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import redis

from gateway.cli.localproc import ProcessGroup, start_redis
from tests.admission.held import held
from tests.fleet import MODEL, Engine, Gateway, wait_until


def _post(gateway: Gateway, key: str) -> int:
    return httpx.post(gateway.url + "/v1/chat/completions", timeout=10,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": MODEL, "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hi"}]}).status_code


def test_acquires_queued_while_redis_was_paused_leave_no_lease(tmp_path: Path) -> None:
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        redis_process = group.children[-1][1]
        engine = Engine(group, "engine")
        gateway = Gateway(group, tmp_path, redis_url, [engine.backend_config()],
                          admission={"fail_mode": "open", "redis_timeout_s": 0.2,
                                     "lease_ttl_s": 60})
        tenant = gateway.create_tenant(limits={"max_concurrent": 1})
        key = gateway.create_key(tenant["id"])
        assert _post(gateway, key) == 200  # the key is cached; the lease came and went

        redis_process.send_signal(signal.SIGSTOP)
        try:
            # Each acquire is written to the paused Redis, times out, and is admitted on the
            # local limits (fail open): it is queued in Redis's socket, not lost.
            assert [_post(gateway, key) for _ in range(3)] == [200] * 3
        finally:
            redis_process.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        client = redis.Redis.from_url(redis_url)

        def served_from_redis() -> bool:
            # Back on Redis (this request was no local fallback) and no phantom lease in the
            # way: the request's own lease goes with its (deferred) settle.
            fell_back = _fail_open(gateway)
            if _post(gateway, key) != 200 or _fail_open(gateway) != fell_back:
                return False
            return wait_until(lambda: held(client, tenant["id"]) == 0, timeout_s=1)

        assert wait_until(served_from_redis, timeout_s=5, interval_s=0.1)
        assert time.monotonic() - resumed < 2.5
        # The queued acquires did run once Redis resumed and counted their leases; the count
        # sent again after them (a newer op) took them back out.
        for _ in range(5):
            assert _post(gateway, key) == 200
        assert wait_until(lambda: held(client, tenant["id"]) == 0, timeout_s=1)


def _fail_open(gateway: Gateway) -> int:
    text = httpx.get(gateway.url + "/metrics", timeout=5).text
    return int(next(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith("switchyard_quota_fail_open_total")))
