"""Telemetry at the gateway's seams: a span per request and per wait, wait histograms, waits report.

The proxy notes when each wait starts and ends (``RequestTrace.waited`` and friends). When the
request finishes, its waits go to the rolling window behind ``/admin/waits`` and to the
Prometheus histograms, and — when tracing is on and the request is sampled — its spans are built
from those timestamps: a SERVER span with the GenAI semantic-convention attributes and one
child span per wait, written straight to OTLP protobuf for the exporter (and as SDK spans for
SDK span processors). Nothing lives during the request but a few floats, so tracing that is off
costs nothing but a flag check, and sampled tracing stays cheap (``gateway/observe/tracing.py``
has the configuration from ``OTEL_*`` and the exporter, ``gateway/observe/otlp.py`` the
encoding). Workers get a W3C ``traceparent`` naming the gateway's span, so their spans join the
same trace.

Example::

    trace = request.app[TELEMETRY].start(request, "chat", time.perf_counter())
    started_s = time.perf_counter()
    principal = await auth.authenticate(...)
    trace.waited("auth", started_s)
    ...
    trace.finish(status=200)
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web
from opentelemetry.propagate import extract
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import (
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
)

from gateway.context import REQUEST_ID
from gateway.observe.tracing import Tracing
from gateway.observe.wait_metrics import WaitMetrics
from gateway.observe.waits import WAIT_TYPES, WaitsWindow
from gateway.routes import ROUTE_PATHS

if TYPE_CHECKING:
    from gateway.router import RoutePlan
    from routing.types import Ranked

_OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings",
               "tokenize": "tokenize", "detokenize": "detokenize", "messages": "chat",
               "count_tokens": "count_tokens", "responses": "chat"}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
# Shorter waits are counted but get no span: a cached key, an immediate admission, a pooled
# connection take a few µs, and a span costs more than that to export.
MIN_WAIT_SPAN_S = 50e-6
# OpenAI's usage and finish reasons, and the Messages and Responses APIs' (stop_reason,
# a Responses status).
_PROMPT_TOKENS_RE = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
_OUTPUT_TOKENS_RE = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
_FINISH_RE = re.compile(rb'"(?:finish|stop)_reason"\s*:\s*"([A-Za-z_]+)"')
# A wait too short for a span of its own has its duration on the request's server span.
_WAIT_ATTRIBUTES = {wait: f"switchyard.wait.{wait}.duration" for wait in WAIT_TYPES}


class Telemetry:
    """Per app: tracing (None when off), the waits window and the wait histograms."""

    def __init__(self, tracing: Tracing | None = None, waits: WaitsWindow | None = None) -> None:
        self.tracing = tracing
        self.waits = waits or WaitsWindow()
        self.metrics: WaitMetrics | None = None

    def start(self, request: web.Request, route: str, started_s: float) -> RequestTrace:
        trace = RequestTrace(self, route, started_s)
        request[REQUEST_TRACE] = trace
        if self.tracing is not None:
            trace.begin_span(self.tracing, request)
        return trace

    def finished(self, trace: RequestTrace, end_s: float) -> None:
        tier = trace.tier
        if tier is None:
            return  # refused before its tier was known (auth, bad body): no wait to report
        e2e_s = end_s - trace.started_s
        self.waits.record(tier, end_s, e2e_s, trace.waits)
        if self.metrics is not None:
            ttft_s = tpot_s = None
            if trace.is_stream and trace.first_byte_s is not None:
                ttft_s = trace.first_byte_s - trace.started_s
                if trace.num_output_tokens > 1:
                    tpot_s = (end_s - trace.first_byte_s) / (trace.num_output_tokens - 1)
            self.metrics.observe(tier, trace.waits, e2e_s, ttft_s, tpot_s)

    def report(self, window_s: float | None = None) -> dict[str, Any]:
        return self.waits.report(time.perf_counter(), window_s)


class RequestTrace:
    """One request's waits, and its span context when sampled."""

    __slots__ = (
        "_attributes",
        "_epoch_ns",
        "_open",
        "_parent",
        "_span_id",
        "_spans",
        "_telemetry",
        "_trace_id",
        "_trace_state",
        "_traceparent",
        "backend",
        "first_byte_s",
        "is_stream",
        "num_output_tokens",
        "route",
        "started_s",
        "tail",
        "tier",
        "waits",
    )
    # Set only when the request is sampled:
    _attributes: dict[str, Any]
    _epoch_ns: int
    _parent: SpanContext | None
    _span_id: int
    _trace_id: int
    _trace_state: Any

    def __init__(self, telemetry: Telemetry, route: str, started_s: float) -> None:
        self._telemetry = telemetry
        self.route = route
        self.started_s = started_s
        self.waits: dict[str, float] = {}
        self.tier: str | None = None
        self.is_stream = False
        self.first_byte_s: float | None = None
        self.backend: str | None = None
        self.num_output_tokens = 0
        self.tail = b""
        self._traceparent: str | None = None
        self._open: tuple[str, float] | None = None
        self._spans: list[tuple[str, float, float, dict[str, Any] | None]] | None = None

    # -- the seams ------------------------------------------------------------------------
    def waiting(self, wait: str) -> None:
        """A wait begins that may end in an exception: ``finish`` closes it if ``waited`` does
        not (a request refused after queueing still waited)."""
        self._open = (wait, time.perf_counter())

    def waited(self, wait: str, started_s: float | None = None,
               attributes: dict[str, Any] | None = None) -> float:
        """Record a wait that began at ``started_s`` (``time.perf_counter()``; by default when
        ``waiting`` opened it) and ends now. It gets a span if it has attributes or lasted
        ``MIN_WAIT_SPAN_S``: a cached key or an immediate admission is not worth a span."""
        now_s = time.perf_counter()
        if started_s is None:
            assert self._open is not None and self._open[0] == wait
            started_s = self._open[1]
            self._open = None
        total_s = self.waits[wait] = self.waits.get(wait, 0.0) + now_s - started_s
        if self._spans is not None:
            if attributes is not None or now_s - started_s >= MIN_WAIT_SPAN_S:
                self._spans.append((wait, started_s, now_s, attributes))
            else:  # too short for a span of its own: its duration on the request's span
                self._attributes[_WAIT_ATTRIBUTES.get(wait) or
                                 f"switchyard.wait.{wait}.duration"] = total_s
        return now_s

    def admitted(self, tier: str, tenant_id: str, model: str, plan: RoutePlan) -> None:
        self.tier = tier
        if self._spans is not None:
            request = plan.request
            self._attributes.update({
                "gen_ai.request.model": model, "switchyard.tier": tier,
                "switchyard.tenant": tenant_id,
                "gen_ai.usage.input_tokens": request.num_prompt_tokens})
            if request.max_tokens is not None:
                self._attributes["gen_ai.request.max_tokens"] = request.max_tokens

    def routed(self, started_s: float, ranked: Sequence[tuple[Any, Ranked]],
               num_prompt_tokens: int) -> None:
        attributes = None
        if self._spans is not None and ranked:
            best = ranked[0][1]
            attributes = {
                "switchyard.routing.backend": best.backend,
                "switchyard.routing.score": best.score,
                "switchyard.routing.expected_cached_tokens": best.expected_cached_tokens,
                "switchyard.routing.expected_prefix_hit":
                    best.expected_cached_tokens / max(1, num_prompt_tokens),
                "switchyard.routing.candidates": len(ranked)}
        self.waited("routing", started_s, attributes)

    def inject(self, headers: dict[str, str]) -> None:
        """Name this request's span as the parent of the worker's spans."""
        if self._traceparent is not None:
            headers["traceparent"] = self._traceparent
            if self._trace_state:
                headers["tracestate"] = self._trace_state.to_header()

    def responded(self, backend: str, sent_s: float, num_attempts: int, is_sse: bool) -> None:
        """The first bytes arrived: the worker's queue and prefill (or whole answer) are over."""
        now_s = time.perf_counter()
        self.first_byte_s = now_s
        self.backend = backend
        self.is_stream = is_sse
        wait = "upstream_ttft" if is_sse else "upstream_response"
        self.waits[wait] = now_s - sent_s - self.waits.get("upstream_connect", 0.0)
        if self._spans is not None:
            self._attributes["switchyard.backend"] = backend
            self._spans.append((wait, sent_s, now_s, {"switchyard.upstream.attempts":
                                                       num_attempts}))

    def streamed(self, tail: bytes, num_output_tokens: int) -> None:
        if self.first_byte_s is not None:
            self.waited("streaming", self.first_byte_s,
                        {"switchyard.stream.output_tokens": num_output_tokens}
                        if self._spans is not None else None)
        self.tail = tail
        self.num_output_tokens = num_output_tokens

    def finish(self, status: int) -> None:
        if self._open is not None:
            self.waited(self._open[0])
        end_s = time.perf_counter()
        self._telemetry.finished(self, end_s)
        if self._spans is not None:
            self._export(status, end_s)

    # -- spans ----------------------------------------------------------------------------
    def begin_span(self, tracing: Tracing, request: web.Request) -> None:
        """Decide sampling and name the span now (workers need it); build it at the end."""
        headers = request.headers
        context = extract(headers) if "traceparent" in headers else None
        parent = get_current_span(context).get_span_context() if context else None
        if parent is not None and not parent.is_valid:
            parent = None
        trace_id = parent.trace_id if parent else tracing.ids.generate_trace_id()
        span_id = tracing.ids.generate_span_id()
        result = tracing.sampler.should_sample(context, trace_id, _OPERATIONS[self.route],
                                               SpanKind.SERVER)
        is_sampled = result.decision.is_sampled()  # type: ignore[no-untyped-call]
        self._traceparent = f"00-{trace_id:032x}-{span_id:016x}-{'01' if is_sampled else '00'}"
        self._trace_state = result.trace_state
        if not is_sampled:
            return
        self._trace_id, self._span_id, self._parent = trace_id, span_id, parent
        self._epoch_ns = time.time_ns() - round((time.perf_counter() - self.started_s) * 1e9)
        self._spans = []
        host = request.host.rpartition(":")
        self._attributes = {
            **dict(result.attributes or {}),
            "gen_ai.operation.name": _OPERATIONS[self.route],
            "http.request.method": request.method, "http.route": ROUTE_PATHS[self.route],
            "server.address": host[0] or host[2], "switchyard.request_id": request[REQUEST_ID]}
        if host[0] and host[2].isdigit():
            self._attributes["server.port"] = int(host[2])

    def _export(self, status: int, end_s: float) -> None:
        """The finished spans, for the OTLP exporter (which encodes them in batches) and/or as
        SDK spans for SDK span processors."""
        tracing = self._telemetry.tracing
        assert tracing is not None and self._spans is not None
        epoch_ns, started_s = self._epoch_ns, self.started_s
        trace_id, server_id, trace_state = self._trace_id, self._span_id, self._trace_state
        new_id = tracing.ids.generate_span_id
        children = [(name, new_id(), epoch_ns + round((start_s - started_s) * 1e9),
                     epoch_ns + round((stop_s - started_s) * 1e9), attributes)
                    for name, start_s, stop_s, attributes in self._spans]
        attributes = self._attributes
        attributes["http.response.status_code"] = status
        tail = self.tail[-2048:]
        if match := _PROMPT_TOKENS_RE.search(tail):
            attributes["gen_ai.usage.input_tokens"] = int(match.group(1))
        if found := _OUTPUT_TOKENS_RE.findall(tail):  # the last: Anthropic's first is 0
            attributes["gen_ai.usage.output_tokens"] = int(found[-1])
        elif self.num_output_tokens:
            attributes["gen_ai.usage.output_tokens"] = self.num_output_tokens
        if reasons := _FINISH_RE.findall(tail):
            attributes["gen_ai.response.finish_reasons"] = tuple(r.decode() for r in reasons)
        status_code, message = StatusCode.UNSET, None
        if status >= 500:
            attributes["error.type"] = str(status)
            status_code, message = StatusCode.ERROR, f"HTTP {status}"
        model = attributes.get("gen_ai.request.model")
        name = f"{attributes['gen_ai.operation.name']} {model}" if model else \
            attributes["gen_ai.operation.name"]
        end_ns = epoch_ns + round((end_s - started_s) * 1e9)
        parent = self._parent
        parent_id = parent.span_id if parent is not None else None
        is_remote = parent is not None and parent.is_remote
        if tracing.exporter is not None:
            tracing.exporter.add((trace_id, server_id, parent_id, is_remote, trace_state, name,
                                  epoch_ns, end_ns, attributes, status_code, message, children),
                                 len(children) + 1)
        if tracing.processors:
            server = SpanContext(trace_id, server_id, False, _SAMPLED, trace_state)
            spans = [ReadableSpan(
                child, SpanContext(trace_id, span_id, False, _SAMPLED, trace_state), server,
                tracing.resource, child_attributes, kind=SpanKind.INTERNAL,
                instrumentation_scope=tracing.scope, start_time=start_ns, end_time=stop_ns)
                for child, span_id, start_ns, stop_ns, child_attributes in children]
            spans.append(ReadableSpan(
                name, server, parent, tracing.resource, attributes, kind=SpanKind.SERVER,
                instrumentation_scope=tracing.scope, status=Status(status_code, message),
                start_time=epoch_ns, end_time=end_ns))
            for processor in tracing.processors:
                for span in spans:
                    processor.on_end(span)


TELEMETRY = web.AppKey("telemetry", Telemetry)
REQUEST_TRACE = web.RequestKey("switchyard_trace", RequestTrace)
