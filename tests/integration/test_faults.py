"""Faults of the engines behind the gateway, with real processes on loopback: a worker that
answers 500s, malformed SSE, JSON that does not parse, truncated bodies, a stream without
[DONE] or one that never ends, and a worker stopped with SIGSTOP (it accepts and never
answers). Every request that had not started streaming is served elsewhere, every cut stream
ends with an error event, and the faulty backend is ejected and let back by a half-open probe
once it behaves."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    python_module_argv,
    start_redis,
    wait_http,
)
from tests.fleet import MODEL, Engine, Gateway, wait_until

ONLY_FAULTY = "faulty-only"
BREAKER = {"consecutive_failures": 3, "ejection_s": 1.0, "min_requests": 1000}


class Faulty:
    def __init__(self, group: ProcessGroup) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        group.spawn("faulty", python_module_argv("tests.faulty_engine", "--port", str(self.port),
                                                 "--model", MODEL, "--model", ONLY_FAULTY))
        wait_http(self.url + "/health", group=group)

    def set(self, mode: str) -> None:
        httpx.post(self.url + "/fault", json={"mode": mode}, timeout=5).raise_for_status()

    @property
    def num_requests(self) -> int:
        return int(httpx.get(self.url + "/fault", timeout=5).json()["num_requests"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProcessGroup, Path, str,
                                                                      Engine, Faulty]]:
    workdir = tmp_path_factory.mktemp("faults")
    with ProcessGroup() as group:
        redis_url = start_redis(group, workdir)
        yield group, workdir, redis_url, Engine(group, "good"), Faulty(group)


def _gateway(fleet: tuple[ProcessGroup, Path, str, Engine, Faulty], **upstream: Any) -> Gateway:
    group, workdir, redis_url, good, faulty = fleet
    backends = [good.backend_config(),
                {"name": "faulty", "url": faulty.url, "models": [MODEL, ONLY_FAULTY]}]
    return Gateway(group, workdir, redis_url, backends,
                   upstream={"breaker": BREAKER, **upstream},
                   routing={"profile": "round_robin"})


def _chat(gateway: Gateway, key: str, *, stream: bool, model: str = MODEL,
          timeout_s: float = 15) -> tuple[int, list[dict[str, Any]], bool]:
    """(status, the stream's events or the body, whether a stream ended with [DONE])."""
    body = {"model": model, "max_tokens": 4, "stream": stream,
            "messages": [{"role": "user", "content": f"hello {uuid.uuid4().hex}"}]}
    headers = {"Authorization": f"Bearer {key}"}
    if not stream:
        response = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers,
                              timeout=timeout_s)
        return response.status_code, [response.json()], False
    events: list[dict[str, Any]] = []
    done = False
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=timeout_s) as response:
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[6:]))
        return response.status_code, events, done


def _breaker(gateway: Gateway, name: str = "faulty") -> dict[str, Any]:
    fleet_page = gateway.admin.get("/admin/fleet").json()["data"]
    return dict(next(b["breaker"] for b in fleet_page if b["name"] == name))


@pytest.mark.parametrize(("mode", "stream"), [
    ("http_500", False), ("http_500", True), ("bad_sse", True), ("bad_json", False),
    ("truncated", False)])
def test_a_faulty_worker_fails_no_request_and_is_ejected(
        fleet: tuple[ProcessGroup, Path, str, Engine, Faulty], mode: str, stream: bool) -> None:
    faulty = fleet[4]
    faulty.set("ok")
    gateway = _gateway(fleet)
    key = gateway.new_key()
    faulty.set(mode)
    before = faulty.num_requests
    results = [_chat(gateway, key, stream=stream) for _ in range(20)]
    assert [status for status, _, _ in results] == [200] * 20
    for _, events, done in results:
        assert not any("error" in event for event in events)
        assert done or not stream
    breaker = _breaker(gateway)
    assert breaker["num_ejections"] >= 1 and breaker["reason"], breaker
    # Round robin would have sent it 10; ejected after 3 it had those and a probe or two.
    assert faulty.num_requests - before <= 6
    # The breaker turns half-open by the clock (ejection_s): the scrape shows the state of
    # its own moment, one of those read just before and just after it.
    codes = {"closed": 0, "open": 1, "half_open": 2}
    state_before = codes[_breaker(gateway)["state"]]
    metrics = httpx.get(gateway.url + "/metrics", timeout=5).text
    state_after = codes[_breaker(gateway)["state"]]
    assert 'switchyard_backend_ejections_total{backend="faulty"}' in metrics
    assert any(f'switchyard_backend_breaker_state{{backend="faulty"}} {state:.1f}' in metrics
               for state in {state_before, state_after}), (state_before, state_after)
    assert 'switchyard_backend_breaker_state{backend="good"} 0.0' in metrics
    gateway.terminate()


def test_an_ejected_worker_is_let_back_by_a_half_open_probe(
        fleet: tuple[ProcessGroup, Path, str, Engine, Faulty]) -> None:
    faulty = fleet[4]
    faulty.set("ok")
    gateway = _gateway(fleet)
    key = gateway.new_key()
    faulty.set("http_500")
    for _ in range(8):
        assert _chat(gateway, key, stream=False)[0] == 200
    assert _breaker(gateway)["state"] in ("open", "half_open")
    faulty.set("ok")
    before = faulty.num_requests
    time.sleep(1.2)  # past ejection_s: the next request it gets is the probe

    def recovered() -> bool:
        assert _chat(gateway, key, stream=False)[0] == 200
        return _breaker(gateway)["state"] == "closed"

    assert wait_until(recovered, timeout_s=10, interval_s=0.05)
    for _ in range(10):
        assert _chat(gateway, key, stream=True)[0] == 200
    assert faulty.num_requests - before >= 5  # round robin shares with it again
    gateway.terminate()


@pytest.mark.parametrize("mode", ["no_done", "never_ending"])
def test_a_stream_cut_by_the_engine_ends_with_an_error_event(
        fleet: tuple[ProcessGroup, Path, str, Engine, Faulty], mode: str) -> None:
    faulty = fleet[4]
    gateway = _gateway(fleet, request_timeout_s=2.0)
    key = gateway.new_key()
    faulty.set(mode)
    started = time.monotonic()
    status, events, done = _chat(gateway, key, stream=True, model=ONLY_FAULTY)
    assert status == 200 and not done
    assert events and "error" in events[-1], events[-1:]
    assert events[-1]["error"]["code"] == "upstream_failed" and events[-1]["error"]["message"]
    assert len(events) > 1  # what the engine sent came first
    if mode == "never_ending":
        assert 1.5 < time.monotonic() - started < 6  # ended at request_timeout_s
    faulty.set("ok")
    gateway.terminate()


def test_a_stopped_worker_loses_no_request(tmp_path: Path) -> None:
    """SIGSTOP: the worker's socket still accepts, nothing answers. The health probe times
    out, the worker is marked down, and the requests waiting for its first byte go to the
    other worker at once instead of waiting first_byte_timeout_s (120 s)."""
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        fast = Engine(group, "fast")
        slow = Engine(group, "slow", extra=("--first-token-delay-ms", "1500"))
        gateway = Gateway(group, tmp_path, redis_url, [fast.backend_config(),
                                                        slow.backend_config()],
                          routing={"profile": "round_robin"})
        key = gateway.new_key()
        with ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(_chat, gateway, key, stream=index % 2 == 0, timeout_s=30)
                       for index in range(12)]
            time.sleep(0.4)  # all sent; those on the slow worker wait for its first token
            slow.process.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                results = [future.result() for future in futures]
                elapsed_s = time.monotonic() - stopped
            finally:
                slow.process.send_signal(signal.SIGCONT)
        assert [status for status, _, _ in results] == [200] * 12
        assert all(done for index, (_, _, done) in enumerate(results) if index % 2 == 0)
        assert elapsed_s < 5, elapsed_s  # the probe's timeout and interval, not 120 s
        assert wait_until(lambda: all(b["is_healthy"] for b in gateway.admin.get(
            "/admin/fleet").json()["data"]), timeout_s=5)
