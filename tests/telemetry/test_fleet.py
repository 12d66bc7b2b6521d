"""Real processes on loopback: a gateway and a simulated worker export OTLP over HTTP to a
receiver started here, and the waits report names the wait that was made to dominate.

One slowed worker (half speed, 2 batch slots) behind one gateway, each tier used by one test:
``interactive`` for the trace, ``standard`` for the slow worker, ``batch`` for the saturated
admission queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli.localproc import (
    ProcessGroup,
    free_port_range,
    python_module_argv,
    start_redis,
    wait_http,
)
from tests.fleet import ADMIN_TOKEN, Gateway
from tests.telemetry.receiver import OtlpReceiver, ReceivedSpan

MODEL = "switchyard-sim"
SERVER = 2  # OTLP SpanKind


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Fleet:
    def __init__(self, gateway: Gateway, receiver: OtlpReceiver) -> None:
        self.gateway = gateway
        self.receiver = receiver

    def waits(self, tier: str) -> dict[str, Any]:
        response = self.gateway.admin.get("/admin/waits")
        assert response.status_code == 200, response.text
        return dict(response.json()["tiers"][tier])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("telemetry")
    with OtlpReceiver() as receiver, ProcessGroup(log_dir=tmp) as group:
        otel = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                "OTEL_BSP_SCHEDULE_DELAY": "100"}
        redis_url = start_redis(group, tmp)
        port = free_port_range(1)
        group.spawn("sim", python_module_argv(
            "backends.sim", "--workers", "1", "--base-port", str(port), "--tokenizer", "approx",
            "--redis-url", redis_url, "--heartbeat-interval-s", "0.2", "--max-batch", "2",
            "--speed-factor", "0.5"), env=otel)
        wait_http(f"http://127.0.0.1:{port}/health", group=group)
        with _environment(otel):
            gateway = Gateway(group, tmp, redis_url, backends=[])
        yield Fleet(gateway, receiver)


def _chat(fleet: Fleet, key: str, content: str, max_tokens: int,
          stream: bool = False) -> httpx.Response:
    usage = {"stream_options": {"include_usage": True}} if stream else {}
    response = httpx.post(fleet.gateway.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "max_tokens": max_tokens, "stream": stream, **usage,
        "messages": [{"role": "user", "content": content}]},
        headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response


def test_gateway_and_worker_spans_share_one_trace(fleet: Fleet) -> None:
    key = fleet.gateway.new_key(tier="interactive")
    request_id = _chat(fleet, key, "hello there", 3, stream=True).headers["x-request-id"]

    def ours(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        gateway = [s for s in spans if s.attributes.get("switchyard.request_id") == request_id]
        trace_ids = {s.trace_id for s in gateway}
        return [s for s in spans if s.trace_id in trace_ids]

    spans = ours(fleet.receiver.wait_for(
        lambda received: {"decode", "streaming"} <= {s.name for s in ours(received)}))
    by_name = {(s.service, s.name): s for s in spans}
    gateway = by_name["switchyard-gateway", f"chat {MODEL}"]
    worker = by_name["switchyard-sim", f"chat {MODEL}"]
    assert gateway.kind == SERVER and worker.kind == SERVER
    assert gateway.parent_span_id == ""  # the gateway started the trace
    assert worker.trace_id == gateway.trace_id
    assert worker.parent_span_id == gateway.span_id
    assert gateway.attributes["gen_ai.usage.output_tokens"] == 3
    assert gateway.attributes["switchyard.tier"] == "interactive"
    for name in ("routing", "upstream_ttft", "streaming"):
        span = by_name["switchyard-gateway", name]
        assert span.parent_span_id == gateway.span_id
    engine = {name: by_name["switchyard-sim", name]
              for name in ("engine_queue", "prefill", "decode")}
    for span in engine.values():
        assert span.parent_span_id == worker.span_id
        assert worker.start_ns <= span.start_ns <= span.end_ns <= worker.end_ns
    assert engine["engine_queue"].end_ns <= engine["prefill"].start_ns + 1_000
    assert engine["prefill"].attributes["switchyard.engine.prompt_tokens"] > 0
    assert "switchyard.engine.cached_tokens" in engine["prefill"].attributes
    assert engine["decode"].attributes["switchyard.engine.output_tokens"] == 3
    assert engine["decode"].attributes["switchyard.engine.decode_steps"] == 2
    assert engine["decode"].attributes["switchyard.engine.preemptions"] == 0


def test_slow_worker_makes_time_to_first_token_dominate(fleet: Fleet) -> None:
    key = fleet.gateway.new_key(tier="standard")
    rng = random.Random(6)
    for _ in range(4):  # one at a time: nothing queues; long, distinct prompts: no cache hits
        prompt = " ".join(f"w{rng.randrange(10**6)}" for _ in range(300))
        _chat(fleet, key, prompt, 2, stream=True)
    figures = fleet.waits("standard")
    assert figures["num_requests"] == 4
    assert figures["most_expensive"]["wait"] == "upstream_ttft", figures
    assert figures["waits"]["upstream_ttft"]["share"] > 0.5
    assert figures["waits"]["admission_queue"]["share"] < 0.05


def test_saturated_admission_queue_dominates(fleet: Fleet, tmp_path: Path) -> None:
    key = fleet.gateway.new_key(tier="batch")

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=fleet.gateway.url, timeout=60) as client:
            async def one(index: int) -> int:
                response = await client.post("/v1/chat/completions", json={
                    "model": MODEL, "max_tokens": 10,
                    "messages": [{"role": "user", "content": f"request {index}"}]},
                    headers={"Authorization": f"Bearer {key}"})
                return response.status_code
            return list(await asyncio.gather(*(one(i) for i in range(12))))

    assert asyncio.run(burst()) == [200] * 12
    figures = fleet.waits("batch")
    assert figures["most_expensive"]["wait"] == "admission_queue", figures
    assert "add workers or shed batch" in figures["most_expensive"]["meaning"]
    # The queued requests' traces show the wait as a span.
    queued = fleet.receiver.wait_for(lambda spans: sum(
        s.name == "admission_queue" and s.end_ns - s.start_ns > 50_000_000 for s in spans) >= 6)
    assert sum(s.name == "admission_queue" and s.end_ns - s.start_ns > 50_000_000
               for s in queued) >= 6

    # The CLI prints the same report, and saves it as a PNG.
    from gateway.cli.commands import main

    png = tmp_path / "waits.png"
    assert main(["waits", "--url", fleet.gateway.url, "--admin-token", ADMIN_TOKEN,
                 "--png", str(png)]) == 0
    assert png.stat().st_size > 1000
