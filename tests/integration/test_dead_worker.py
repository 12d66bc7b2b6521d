"""A worker killed mid-run leaves the routing set at its first failed request and stays out:
re-reading its last heartbeat (still in Redis until its TTL) does not bring it back."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx

from gateway.cli.localproc import (
    ProcessGroup,
    free_port_range,
    python_module_argv,
    start_redis,
    wait_http,
)
from tests.fleet import Gateway, wait_until

MODEL = "switchyard-sim"


def _sim(group: ProcessGroup, redis_url: str, worker_id: str) -> tuple[object, str]:
    port = free_port_range(1)
    proc = group.spawn(worker_id, python_module_argv(
        "backends.sim", "--workers", "1", "--base-port", str(port), "--model", MODEL,
        "--tokenizer", "approx", "--redis-url", redis_url, "--heartbeat-interval-s", "0.5"))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", group=group)
    return proc, url


def test_a_killed_worker_stays_out(tmp_path: Path) -> None:
    with ProcessGroup(log_dir=tmp_path) as group:
        redis_url = start_redis(group, tmp_path)
        doomed, doomed_url = _sim(group, redis_url, "sim-a")
        _sim(group, redis_url, "sim-b")
        gateway = Gateway(group, tmp_path, redis_url, [],
                          routing={"profile": "round_robin"})
        key = gateway.new_key()

        def chat() -> httpx.Response:
            return httpx.post(gateway.url + "/v1/chat/completions", timeout=10,
                              headers={"Authorization": f"Bearer {key}"},
                              json={"model": MODEL, "max_tokens": 2,
                                    "messages": [{"role": "user", "content": "hi"}]})

        def fleet() -> dict[str, bool]:
            data = gateway.admin.get("/admin/fleet").json()["data"]
            return {b["url"]: b["is_healthy"] for b in data}

        assert wait_until(lambda: len(fleet()) == 2 and all(fleet().values()), timeout_s=10)
        doomed.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
        doomed.wait()  # type: ignore[attr-defined]
        killed_at = time.monotonic()
        # Requests keep being answered (retried elsewhere before the first byte).
        assert [chat().status_code for _ in range(4)] == [200] * 4
        assert wait_until(lambda: fleet().get(doomed_url) is False, timeout_s=1.0)
        out_at = time.monotonic()
        assert out_at - killed_at < 2.0
        flaps = 0
        while time.monotonic() < killed_at + 4.0:  # polls re-read its heartbeat meanwhile
            flaps += fleet().get(doomed_url) is True
            assert chat().status_code == 200
            time.sleep(0.05)
        assert flaps == 0
