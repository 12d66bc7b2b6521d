"""``switchyard serve --workers N`` (gateway/workers.py): N real gateway processes on one port
behind a supervisor, a real redis-server and mock engines on loopback. Connections spread over
the workers, a quota holds across them, a reload reaches them all, a killed worker comes back,
/metrics shows every worker, and SIGTERM drains them all."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli.localproc import ProcessGroup, python_module_argv
from tests.fleet import MODEL, Engine, Gateway, wait_until

NUM_WORKERS = 3


@pytest.fixture(scope="module")
def fleet(workdir: Path, redis_url: str) -> Iterator[tuple[Gateway, Engine]]:
    with ProcessGroup() as group:
        engine = Engine(group, "workers-engine")
        gateway = Gateway(group, workdir, redis_url, [engine.backend_config()],
                          listen={"workers": NUM_WORKERS}, drain_timeout_s=10)
        assert wait_until(lambda: len(_workers(gateway)) == NUM_WORKERS, timeout_s=10)
        yield gateway, engine


def _workers(gateway: Gateway) -> list[int]:
    pid = gateway.process.pid
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(child) for child in children]


def _chat(gateway: Gateway, key: str, **extra: object) -> httpx.Response:
    """One request on a connection of its own, so that the kernel picks its worker."""
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
            **extra}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=15,
                      headers={"Authorization": f"Bearer {key}", "Connection": "close"})


def _requests_by_worker(gateway: Gateway) -> dict[str, float]:
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "switchyard_requests":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["route"] == "chat":
                    worker = sample.labels["worker"]
                    counts[worker] = counts.get(worker, 0.0) + sample.value
    return counts


def test_connections_spread_over_every_worker_and_metrics_show_each(
        fleet: tuple[Gateway, Engine]) -> None:
    gateway, _ = fleet
    before = _requests_by_worker(gateway)
    key = gateway.new_key()
    for _ in range(60):
        assert _chat(gateway, key).status_code == 200
    after = _requests_by_worker(gateway)
    assert sorted(after) == [str(i) for i in range(NUM_WORKERS)]
    added = {w: after[w] - before.get(w, 0.0) for w in after}
    assert sum(added.values()) == 60
    assert all(count > 0 for count in added.values()), added


def test_a_tenants_quota_holds_across_workers(fleet: tuple[Gateway, Engine]) -> None:
    gateway, _ = fleet
    key = gateway.new_key(limits={"requests_per_minute": 10})
    statuses = [_chat(gateway, key).status_code for _ in range(20)]
    assert statuses.count(200) == 10 and statuses.count(429) == 10, statuses


def test_a_reload_on_one_worker_reaches_every_worker(fleet: tuple[Gateway, Engine]) -> None:
    gateway, _ = fleet
    config = yaml.safe_load(gateway.config_path.read_text())
    config["aliases"] = [{"name": "reloaded-alias", "targets": [MODEL]}]
    gateway.config_path.write_text(yaml.safe_dump(config))
    response = gateway.admin.post("/admin/reload")
    assert response.status_code == 200 and "aliases" in response.json()["applied"]
    key = gateway.new_key()

    def every_worker_knows_it() -> bool:
        return all(_chat(gateway, key, model="reloaded-alias").status_code == 200
                   for _ in range(3 * NUM_WORKERS))

    assert wait_until(every_worker_knows_it, timeout_s=10)


def test_a_killed_worker_is_restarted(fleet: tuple[Gateway, Engine]) -> None:
    gateway, _ = fleet
    victim = _workers(gateway)[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_until(lambda: len(_workers(gateway)) == NUM_WORKERS
                      and victim not in _workers(gateway), timeout_s=15)
    key = gateway.new_key()
    assert wait_until(lambda: all(_chat(gateway, key).status_code == 200 for _ in range(12)),
                      timeout_s=15)


def test_memory_state_is_refused(workdir: Path) -> None:
    config = workdir / "memory-workers.yaml"
    config.write_text(yaml.safe_dump({"state": "memory", "listen": {"port": 0}}))
    done = subprocess.run(python_module_argv("gateway", "serve", "--config", str(config),
                                             "--workers", "2"),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "state: redis" in done.stderr


def test_sigterm_drains_every_worker(workdir: Path, redis_url: str) -> None:
    """A stream in flight finishes after SIGTERM; then every worker and the supervisor exit."""
    with ProcessGroup() as group:
        engine = Engine(group, "drain-engine")
        gateway = Gateway(group, workdir, redis_url, [engine.backend_config()],
                          listen={"workers": 2}, drain_timeout_s=10)
        assert wait_until(lambda: len(_workers(gateway)) == 2, timeout_s=10)
        workers = _workers(gateway)
        key = gateway.new_key()
        body = {"model": MODEL, "max_tokens": 20, "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
                "mock": {"token_delay_ms": 100}}
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as stream:
            lines = stream.iter_lines()
            first = next(lines)
            assert first.startswith("data: ")
            gateway.terminate()
            rest = list(lines)
        assert any(line == "data: [DONE]" for line in rest), rest[-3:]
        assert gateway.process.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
            time.sleep(0.05)
        assert not [w for w in workers if Path(f"/proc/{w}/status").exists()
                    and "zombie" not in Path(f"/proc/{w}/status").read_text()]
