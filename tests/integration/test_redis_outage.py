"""Redis stopped mid-run: the configured fail mode holds and nothing hangs."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from gateway.cli.localproc import ProcessGroup, start_redis
from tests.fleet import Engine, Gateway

MODEL = "switchyard-mock"


def _post(gateway: Gateway, key: str) -> tuple[int, float]:
    started = time.monotonic()
    response = httpx.post(gateway.url + "/v1/chat/completions", timeout=10,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"model": MODEL, "max_tokens": 2,
                                "messages": [{"role": "user", "content": "hi"}]})
    return response.status_code, time.monotonic() - started


@pytest.mark.parametrize(("fail_mode", "expected_status"), [("open", 200), ("closed", 503)])
def test_redis_lost_mid_run(tmp_path: Path, fail_mode: str, expected_status: int) -> None:
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        redis_process = group.children[-1][1]
        engine = Engine(group, "engine")
        gateway = Gateway(group, tmp_path, redis_url, [engine.backend_config()],
                          admission={"fail_mode": fail_mode, "redis_timeout_s": 0.2})
        key = gateway.new_key(limits={"requests_per_minute": 1000})
        assert _post(gateway, key)[0] == 200  # the key is now in the gateway's cache

        redis_process.send_signal(signal.SIGKILL)
        redis_process.wait()
        results = [_post(gateway, key) for _ in range(5)]
        assert {status for status, _ in results} == {expected_status}, results
        assert max(elapsed for _, elapsed in results) < 1.5, results  # never hangs on Redis
        ready = httpx.get(gateway.url + "/readyz", timeout=5)
        assert ready.status_code == 503 and "Redis" in ready.json()["error"]["message"]
        metrics = httpx.get(gateway.url + "/metrics", timeout=5).text
        counter = f"switchyard_quota_fail_{fail_mode}_total"
        value = next(float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith(counter))
        assert value >= 1
        # An unknown key cannot be checked without Redis: a clear 503, not a hang.
        status, elapsed = _post(gateway, "sy-0123456789abcdef-" + "A" * 43)
        assert status == 503 and elapsed < 3.5
