"""Two gateway replicas over one Redis see each other's requests in flight: what one sends to a
backend counts in the other's routing at once (within a flush), not after the engine's next
figures; and when those requests end, it stops counting."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx

from gateway.cli.localproc import ProcessGroup, start_redis
from tests.fleet import MODEL, Engine, Gateway, wait_until


def _fleet_view(gateway: Gateway) -> dict[str, Any]:
    return {b["name"]: b for b in gateway.admin.get("/admin/fleet").json()["data"]}


def test_a_replica_counts_the_others_requests_in_flight(tmp_path: Path) -> None:
    with ProcessGroup(log_dir=tmp_path) as group:
        redis_url = start_redis(group, tmp_path)
        engine = Engine(group, "slow", extra=("--token-delay-ms", "100"))
        backends = [engine.backend_config()]
        sender = Gateway(group, tmp_path, redis_url, backends)
        watcher = Gateway(group, tmp_path, redis_url, backends)
        key = sender.new_key(limits={"requests_per_minute": 10_000})

        def slow_request() -> None:  # 30 tokens, 100 ms apart: 3 s in flight
            httpx.post(sender.url + "/v1/chat/completions", timeout=30,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"model": MODEL, "max_tokens": 30,
                             "messages": [{"role": "user", "content": "count slowly"}]})

        threads = [threading.Thread(target=slow_request) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            assert wait_until(lambda: _fleet_view(watcher)["slow"]["peer_in_flight"] == 4,
                              timeout_s=2.0), _fleet_view(watcher)
            seen = _fleet_view(watcher)["slow"]
            assert seen["num_in_flight"] == 0  # none of its own
            assert _fleet_view(sender)["slow"]["peer_in_flight"] == 0
        finally:
            for thread in threads:
                thread.join(timeout=30)
        assert wait_until(lambda: _fleet_view(watcher)["slow"]["peer_in_flight"] == 0,
                          timeout_s=2.0)
