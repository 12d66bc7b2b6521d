"""The lean OTLP encoder writes what the SDK's encoder writes; OTEL_* turns tracing on and off."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from gateway.observe.otlp import encode_children, encode_request, encode_span_fields, framed_span
from gateway.observe.tracing import OtlpHttpExporter, TelemetryConfigError, tracing_from_env

RESOURCE = Resource.create({"service.name": "test"})
SCOPE = InstrumentationScope("switchyard.gateway", "0.1.0")
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _span(name: str = "auth", *, attributes: dict[str, Any] | None = None,
          parent: SpanContext | None = None, **fields: Any) -> ReadableSpan:
    context = SpanContext(TRACE_ID, fields.pop("span_id", 0xA1), False, SAMPLED,
                          fields.pop("trace_state", None))
    return ReadableSpan(name, context, parent, fields.pop("resource", RESOURCE), attributes,
                        instrumentation_scope=fields.pop("scope", SCOPE),
                        start_time=1_700_000_000_000_000_000, end_time=1_700_000_000_000_123_456,
                        **fields)


LOCAL_PARENT = SpanContext(TRACE_ID, 0xB2, False, SAMPLED)
REMOTE_PARENT = SpanContext(TRACE_ID, 0xC3, True, SAMPLED)


@pytest.mark.parametrize("spans", [
    pytest.param([_span()], id="bare"),
    pytest.param([_span(attributes={"s": "text", "t": True, "f": False, "i": 7, "neg": -3,
                                    "big": 2**62, "x": 0.25, "e": "", "u": "naïve ✓"})],
                 id="scalar-attributes"),
    pytest.param([_span(attributes={"ss": ["stop", "length"], "ii": [1, -2], "bb": [True]})],
                 id="array-attributes"),
    pytest.param([_span(parent=LOCAL_PARENT, kind=SpanKind.SERVER)], id="local-parent"),
    pytest.param([_span(parent=REMOTE_PARENT, kind=SpanKind.SERVER)], id="remote-parent"),
    pytest.param([_span(status=Status(StatusCode.ERROR, "HTTP 502"))], id="error-status"),
    pytest.param([_span(trace_state=TraceState([("vendor", "v1"), ("x", "y")]))],
                 id="trace-state"),
    pytest.param([_span(attributes={"long": "x" * 300})], id="long-string"),
    pytest.param([_span(attributes={"switchyard.wait.auth.duration": 1.5e-5, "k" * 200: -0.0,
                                    "nan": float("nan"), "inf": float("inf")})],
                 id="float-attributes"),
    pytest.param([_span(span_id=1), _span("b", span_id=2),
                  _span("c", span_id=3, resource=Resource.create({"service.name": "other"})),
                  _span("d", span_id=4, scope=None)], id="grouped-by-resource-and-scope"),
])
def test_lean_encoding_matches_the_sdk(spans: list[ReadableSpan]) -> None:
    ours = ExportTraceServiceRequest.FromString(encode_request(spans))
    assert ours == encode_spans(spans)
    # Twice: the second run comes from the attribute cache.
    assert ExportTraceServiceRequest.FromString(encode_request(spans)) == ours


def _exporters(env: dict[str, str]) -> list[str]:
    tracing = tracing_from_env(env)
    if tracing is None:
        return []
    found = ["otlp"] if tracing.exporter is not None else []
    found += [type(p.span_exporter).__name__ for p in tracing.processors]  # type: ignore[attr-defined]
    tracing.provider.shutdown()
    return found


@pytest.mark.parametrize(("env", "expected"), [
    pytest.param({}, [], id="nothing-set-is-off"),
    pytest.param({"OTEL_TRACES_EXPORTER": "none"}, [], id="none"),
    pytest.param({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ["otlp"],
                 id="endpoint-implies-otlp"),
    pytest.param({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"], id="otlp"),
    pytest.param({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "ConsoleSpanExporter"],
                 id="two"),
    pytest.param({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, [],
                 id="sdk-disabled"),
    pytest.param({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "none"},
                 [], id="none-wins-over-endpoint"),
])
def test_tracing_from_env(env: dict[str, str], expected: list[str]) -> None:
    assert _exporters(env) == expected


@pytest.mark.parametrize(("env", "endpoint", "headers", "timeout_s", "delay_s"), [
    pytest.param({}, "http://localhost:4318/v1/traces", {}, 10.0, 5.0, id="defaults"),
    pytest.param({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/",
                  "OTEL_EXPORTER_OTLP_HEADERS": "api-key=a%20b, x=1",
                  "OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_BSP_SCHEDULE_DELAY": "100"},
                 "http://c:4318/v1/traces", {"api-key": "a b", "x": "1"}, 2.5, 0.1,
                 id="general"),
    pytest.param({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                  "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/traces",
                  "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "k=v",
                  "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "500"},
                 "http://t:9/traces", {"k": "v"}, 0.5, 5.0, id="traces-specific-wins"),
])
def test_otlp_exporter_settings(env: dict[str, str], endpoint: str, headers: dict[str, str],
                                timeout_s: float, delay_s: float) -> None:
    exporter = OtlpHttpExporter.from_env(env)
    assert exporter.endpoint == endpoint
    assert {k: v for k, v in exporter.headers.items() if k != "Content-Type"} == headers
    assert exporter.timeout_s == timeout_s
    assert exporter.schedule_delay_s == delay_s


@pytest.mark.parametrize(("env", "message"), [
    pytest.param({"OTEL_TRACES_EXPORTER": "jaeger"}, "unknown exporter 'jaeger'", id="unknown"),
    pytest.param({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
                 "set it to 'http/protobuf'", id="grpc"),
    pytest.param({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
                 "use gzip or none", id="compression"),
    pytest.param({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "soon"},
                 "is not a number", id="not-a-number"),
])
def test_unsupported_settings_say_what_to_change(env: dict[str, str], message: str) -> None:
    with pytest.raises(TelemetryConfigError, match=message):
        tracing_from_env(env)


@pytest.mark.parametrize("trace_state", [pytest.param(None, id="plain"),
                                         pytest.param(TraceState([("v", "1")]), id="trace-state")])
def test_children_match_one_span_at_a_time(trace_state: TraceState | None) -> None:
    children = [("auth", 0x11, 10, 20, None), ("routing", 0x12, 30, 40, {"b": "w1", "s": 0.5}),
                ("upstream_ttft", 0x13, 50, 90, {"n": 1})]
    one_by_one = b"".join(framed_span(encode_span_fields(
        TRACE_ID, span_id, 0xB2, False, name, SpanKind.INTERNAL, start_ns, end_ns, attributes,
        trace_state=trace_state)) for name, span_id, start_ns, end_ns, attributes in children)
    assert encode_children(TRACE_ID, 0xB2, trace_state, children) == one_by_one
