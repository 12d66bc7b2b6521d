"""Span structure and attributes: an in-process gateway (aiohttp test server) with the SDK's
in-memory exporter, in front of a real mock engine and a real redis-server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.app import create_app
from gateway.cli.localproc import ProcessGroup
from gateway.observe.otlp import RequestSpans, encode_request_spans, export_request
from gateway.observe.telemetry import MIN_WAIT_SPAN_S, TELEMETRY, Telemetry
from gateway.observe.tracing import OtlpHttpExporter, Tracing
from gateway.settings import Settings
from tests.fleet import ADMIN_TOKEN, MODEL, Engine

CLIENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def engine(procs: ProcessGroup) -> Engine:
    return Engine(procs, "engine-telemetry")


class InProcessGateway:
    def __init__(self, client: TestClient[Any, Any], exporter: InMemorySpanExporter | None,
                 key: str, engine: Engine) -> None:
        self.client = client
        self.exporter = exporter
        self.key = key
        self.engine = engine

    async def chat(self, headers: dict[str, str] | None = None, **body: Any) -> Any:
        payload = {"model": MODEL, "max_tokens": 4,
                   "messages": [{"role": "user", "content": "one two three"}], **body}
        response = await self.client.post(
            "/v1/chat/completions", json=payload,
            headers={"Authorization": f"Bearer {self.key}", **(headers or {})})
        text = await response.text()
        assert response.status == 200, text
        return response

    def spans(self) -> dict[str, ReadableSpan]:
        assert self.exporter is not None
        finished = self.exporter.get_finished_spans()
        self.exporter.clear()
        return {span.name: span for span in finished}


class CapturingExporter(OtlpHttpExporter):
    """The OTLP exporter's input, kept here instead of sent."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9/v1/traces")
        self.captured: list[RequestSpans] = []

    def add(self, spans: RequestSpans, num_spans: int) -> None:
        self.captured.append(spans)


async def _gateway(engine: Engine, redis_url: str, *, is_traced: bool,
                   limits: dict[str, int] | None = None,
                   otlp: OtlpHttpExporter | None = None) -> AsyncIterator[InProcessGateway]:
    settings = Settings.model_validate({
        "redis_url": redis_url, "admin_token": ADMIN_TOKEN,
        "backends": [engine.backend_config()],
        "routing": {"discover_workers": False},
        "upstream": {"health_interval_s": 0.5},
        "log_level": "warning",
    })
    app = create_app(settings)
    exporter = None
    if is_traced:
        exporter = InMemorySpanExporter()
        app[TELEMETRY] = Telemetry(Tracing.create(
            service_name="test-gateway", processors=[SimpleSpanProcessor(exporter)],
            exporter=otlp))
    else:
        app[TELEMETRY] = Telemetry(None)
    async with TestClient(TestServer(app)) as client:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        tenant = await client.post("/admin/tenants", headers=admin, json={
            "name": "telemetry", "limits": limits or {}})
        assert tenant.status == 201, await tenant.text()
        key = await client.post("/admin/keys", headers=admin,
                                json={"tenant_id": (await tenant.json())["id"]})
        yield InProcessGateway(client, exporter, (await key.json())["key"], engine)


@pytest.fixture
async def traced(engine: Engine, redis_url: str) -> AsyncIterator[InProcessGateway]:
    async for gateway in _gateway(engine, redis_url, is_traced=True,
                                  limits={"requests_per_minute": 10_000}):
        yield gateway


@pytest.fixture
async def exported(engine: Engine, redis_url: str) -> AsyncIterator[InProcessGateway]:
    async for gateway in _gateway(engine, redis_url, is_traced=True, otlp=CapturingExporter()):
        yield gateway


@pytest.fixture
async def untraced(engine: Engine, redis_url: str) -> AsyncIterator[InProcessGateway]:
    async for gateway in _gateway(engine, redis_url, is_traced=False):
        yield gateway


@pytest.mark.parametrize(("is_stream", "mock"), [
    pytest.param(False, {}, id="json"),
    pytest.param(True, {}, id="stream"),
    # One event per read: the usage event and [DONE] reach the gateway apart.
    pytest.param(True, {"mock": {"token_delay_ms": 2}}, id="stream-paced"),
])
async def test_request_span_has_genai_attributes_and_a_child_per_wait(
    traced: InProcessGateway, is_stream: bool, mock: dict[str, Any]
) -> None:
    started_ns = time.time_ns()
    response = await traced.chat(stream=is_stream, stream_options={"include_usage": True}
                                 if is_stream else None, **mock)
    await response.read()
    spans = traced.spans()
    server = spans.pop(f"chat {MODEL}")
    assert server.kind is SpanKind.SERVER
    assert server.parent is None  # the client sent no traceparent: the gateway starts the trace
    attributes = dict(server.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == MODEL
    assert attributes["gen_ai.request.max_tokens"] == 4
    assert attributes["gen_ai.usage.output_tokens"] == 4
    assert attributes["gen_ai.usage.input_tokens"] > 0
    # Read from the last chunk relayed: a stream whose [DONE] came in a read of its own has none.
    if not is_stream or "gen_ai.response.finish_reasons" in attributes:
        assert list(attributes["gen_ai.response.finish_reasons"]) == ["length"]
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["http.response.status_code"] == 200
    assert attributes["switchyard.tier"] == "standard"
    assert attributes["switchyard.backend"] == "engine-telemetry"
    assert attributes["switchyard.tenant"].startswith("t")
    assert attributes["switchyard.request_id"] == response.headers["x-request-id"]

    upstream = "upstream_ttft" if is_stream else "upstream_response"
    expected = {"quota", "routing", upstream}  # quota: a Redis round trip, never under 50 µs
    if is_stream:
        expected.add("streaming")
    assert expected <= set(spans), sorted(spans)
    # Waits under MIN_WAIT_SPAN_S have no span: a cached key, an immediate admission, a
    # pooled connection.
    assert set(spans) - expected <= {"auth", "admission_queue", "upstream_connect"}
    # ... but each is on the trace: a span of its own, or its duration on the server span.
    server_s = (server.end_time - server.start_time) / 1e9
    for wait in ("auth", "admission_queue", "upstream_connect", "quota", "routing", upstream):
        key = f"switchyard.wait.{wait}.duration"
        assert (wait in spans) != (key in attributes), wait
        if key in attributes:
            assert 0.0 <= attributes[key] <= min(MIN_WAIT_SPAN_S, server_s), wait
    for span in spans.values():
        assert span.context.trace_id == server.context.trace_id
        assert span.parent is not None and span.parent.span_id == server.context.span_id
        assert span.kind is SpanKind.INTERNAL
        assert server.start_time <= span.start_time <= span.end_time <= server.end_time
    assert started_ns <= server.start_time
    routing = dict(spans["routing"].attributes or {})
    assert routing["switchyard.routing.backend"] == "engine-telemetry"
    assert 0.0 <= routing["switchyard.routing.expected_prefix_hit"] <= 1.0
    assert isinstance(routing["switchyard.routing.score"], float)

    # The engine was told to continue the gateway's trace, under the gateway's span.
    traceparent = traced.engine.stats()["last_headers"]["traceparent"]
    assert traceparent == (f"00-{server.context.trace_id:032x}-"
                           f"{server.context.span_id:016x}-01")


async def test_client_traceparent_is_continued(traced: InProcessGateway) -> None:
    await traced.chat(headers={"traceparent": f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"})
    server = traced.spans()[f"chat {MODEL}"]
    assert f"{server.context.trace_id:032x}" == CLIENT_TRACE_ID
    assert server.parent is not None and f"{server.parent.span_id:016x}" == CLIENT_SPAN_ID
    assert server.parent.is_remote
    sent = traced.engine.stats()["last_headers"]["traceparent"]
    assert sent == f"00-{CLIENT_TRACE_ID}-{server.context.span_id:016x}-01"


async def test_upstream_error_marks_the_span(traced: InProcessGateway) -> None:
    response = await traced.client.post(
        "/v1/chat/completions", headers={"Authorization": f"Bearer {traced.key}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
              "mock": {"status": 500}})
    assert response.status == 500  # the engine's OpenAI error body, relayed
    server = traced.spans()[f"chat {MODEL}"]
    assert server.status.status_code is StatusCode.ERROR
    assert dict(server.attributes or {})["error.type"] == "500"


async def test_tracing_off_creates_no_span_and_forwards_the_clients_header(
    untraced: InProcessGateway,
) -> None:
    header = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
    await untraced.chat(headers={"traceparent": header})
    assert untraced.engine.stats()["last_headers"]["traceparent"] == header
    telemetry = untraced.client.app[TELEMETRY]  # type: ignore[index]
    assert telemetry.tracing is None
    waits = telemetry.report()["tiers"]["standard"]
    assert waits["num_requests"] == 1  # the waits are still counted
    # A new app opened a new connection to the engine, and timed it.
    assert waits["waits"]["upstream_connect"]["total_s"] > 0


async def test_wait_histograms_on_metrics(untraced: InProcessGateway) -> None:
    await untraced.chat(stream=True)
    text = await (await untraced.client.get("/metrics")).text()
    assert 'switchyard_wait_duration_seconds_count{tier="standard",wait="routing"} 1.0' in text
    assert 'switchyard_ttft_seconds_count{tier="standard"} 1.0' in text
    assert 'switchyard_tpot_seconds_count{tier="standard"} 1.0' in text
    assert 'switchyard_e2e_duration_seconds_count{tier="standard"} 1.0' in text


async def test_admin_waits_needs_the_admin_token(untraced: InProcessGateway) -> None:
    response = await untraced.client.get(
        "/admin/waits", headers={"Authorization": f"Bearer {untraced.key}"})
    assert response.status == 403
    response = await untraced.client.get(
        "/admin/waits?window_s=abc", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "window_s"


async def test_otlp_export_writes_the_same_spans_as_the_sdk(exported: InProcessGateway) -> None:
    await (await exported.chat(stream=True, stream_options={"include_usage": True})).read()
    await exported.chat(headers={"traceparent": f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"})
    assert exported.exporter is not None
    sdk_spans = exported.exporter.get_finished_spans()
    tracing = exported.client.app[TELEMETRY].tracing  # type: ignore[index]
    otlp = tracing.exporter
    assert isinstance(otlp, CapturingExporter) and len(otlp.captured) == 2
    framed = b"".join(encode_request_spans(spans) for spans in otlp.captured)
    ours = export_request(tracing.resource, tracing.scope, framed)
    assert ExportTraceServiceRequest.FromString(ours) == encode_spans(sdk_spans)
