"""Redis stopped mid-run: the configured fail mode holds and nothing hangs; a key the gateway
never saw is a 503 that says the key store is unreachable (not a missing backend), and the log
says each cause once per interval instead of several times a second."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    free_port_range,
    python_module_argv,
    start_redis,
)
from tests.fleet import Engine, Gateway, wait_until

MODEL = "switchyard-mock"
SIM = "switchyard-sim"


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


BODY = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def test_an_outage_is_a_clear_503_and_a_quiet_log(tmp_path: Path) -> None:
    with ProcessGroup(log_dir=tmp_path) as group:
        redis_url = start_redis(group, tmp_path)
        redis_process = group.children[-1][1]
        engine = Engine(group, "engine")
        gateway = Gateway(group, tmp_path, redis_url, [engine.backend_config()],
                          routing={"discover_workers": True})
        known, unseen = gateway.new_key(), gateway.new_key()
        headers = {"Authorization": f"Bearer {known}"}
        assert httpx.post(gateway.url + "/v1/chat/completions", json=BODY, headers=headers,
                          timeout=10).status_code == 200
        log_path = tmp_path / f"gateway-{gateway.port}.log"
        before = len(log_path.read_text().splitlines())
        redis_process.send_signal(signal.SIGKILL)
        redis_process.wait()
        time.sleep(4.0)  # every background loop meets the outage several times
        answer = httpx.post(gateway.url + "/v1/chat/completions", json=BODY, timeout=10,
                            headers={"Authorization": f"Bearer {unseen}"})
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "key_store_unavailable"
        assert "not in the gateway's cache" in error["message"]
        assert int(answer.headers["Retry-After"]) >= 1
        admin = gateway.admin.get("/admin/tenants")  # the admin API needs Redis: 503, not 500
        assert admin.status_code == 503, admin.text
        assert admin.json()["error"]["code"] == "state_store_unavailable"
        time.sleep(1.0)
        lines = log_path.read_text().splitlines()[before:]
        warnings = [line for line in lines if " WARNING " in line or " ERROR " in line]
        causes = {line.split(": ", 1)[0].split(" ", 3)[-1] + line.split(": ", 2)[1][:30]
                  for line in warnings}
        # Within one interval (10 s) a cause is told once: a handful of lines, not ~40.
        assert warnings and len(warnings) <= len(causes) + 2, "\n".join(warnings)


def test_a_redis_restart_keeps_the_workers(tmp_path: Path) -> None:
    """Redis restarted empty: every heartbeat key is gone at once, but the workers beat again
    within their interval, so the gateway keeps them (it used to drop them all and answer 404
    model_not_found until they did)."""
    with ProcessGroup(log_dir=tmp_path) as group:
        port = free_port()
        redis_url = start_redis(group, tmp_path, port=port)
        redis_process = group.children[-1][1]
        base = free_port_range(2)
        group.spawn("sims", python_module_argv(
            "backends.sim", "--workers", "2", "--base-port", str(base), "--model", SIM,
            "--tokenizer", "approx", "--redis-url", redis_url, "--heartbeat-interval-s", "0.5"))
        gateway = Gateway(group, tmp_path, redis_url, [])
        keys = [gateway.new_key()]

        def chat() -> int:
            return httpx.post(gateway.url + "/v1/chat/completions", timeout=10,
                              headers={"Authorization": f"Bearer {keys[-1]}"},
                              json={"model": SIM, "max_tokens": 2,
                                    "messages": [{"role": "user", "content": "hi"}]}).status_code

        def workers() -> int:
            return len(gateway.admin.get("/admin/fleet").json()["data"])

        assert wait_until(lambda: workers() == 2, timeout_s=10)
        assert chat() == 200  # the key is now in the gateway's cache
        redis_process.send_signal(signal.SIGKILL)
        redis_process.wait()
        start_redis(group, tmp_path, port=port)  # the same address, nothing in it
        keys.append(gateway.new_key())  # tenants and keys went with it (no persistence here)
        statuses, counts = [], []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            statuses.append(chat())
            counts.append(workers())
            time.sleep(0.05)
        assert set(statuses) == {200}, statuses
        assert set(counts) == {2}, counts
