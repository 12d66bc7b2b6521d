"""Redis gone under a running gateway: a key it never saw is a 503 that says the key store is
unreachable (not a missing backend), and the log says each cause once per interval instead of
several times a second."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx

from gateway.cli.localproc import ProcessGroup, start_redis
from tests.fleet import Engine, Gateway

BODY = {"model": "switchyard-mock", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]}


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
        time.sleep(1.0)
        lines = log_path.read_text().splitlines()[before:]
        warnings = [line for line in lines if " WARNING " in line or " ERROR " in line]
        causes = {line.split(": ", 1)[0].split(" ", 3)[-1] + line.split(": ", 2)[1][:30]
                  for line in warnings}
        # Within one interval (10 s) a cause is told once: a handful of lines, not ~40.
        assert warnings and len(warnings) <= len(causes) + 2, "\n".join(warnings)
