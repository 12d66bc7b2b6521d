"""Tracing configured from the standard ``OTEL_*`` variables, and the gateway's OTLP exporter.

Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``) or, unset,
when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set. The SDK supplies the
sampler (``OTEL_TRACES_SAMPLER`` / ``_ARG``), the span and trace ids and the resource
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``). ``console`` goes through the SDK's
span processor and exporter. ``otlp`` is OTLP/HTTP with protobuf, sent by
``OtlpHttpExporter`` from the event loop: each request hands over its spans as one tuple,
encoded (``gateway.observe.otlp``) a batch at a time, with no thread and no span objects, because
the SDK's threaded exporter costs about as much CPU per traced request as the gateway
itself. It reads
``OTEL_EXPORTER_OTLP_[TRACES_]{ENDPOINT,HEADERS,TIMEOUT,COMPRESSION,CERTIFICATE}`` and
``OTEL_BSP_{SCHEDULE_DELAY,MAX_QUEUE_SIZE,MAX_EXPORT_BATCH_SIZE}`` like the SDK's.

Example::

    tracing = tracing_from_env()       # None when tracing is off
    if tracing is not None and tracing.exporter is not None:
        task = asyncio.create_task(tracing.exporter.run())
        tracing.exporter.add(request_spans, num_spans=5)   # gateway.observe.otlp.RequestSpans
        await tracing.exporter.close()  # the last batch goes out
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import os
import ssl
import time
import urllib.parse
from collections import deque
from collections.abc import Iterator, Mapping, Sequence

import aiohttp
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from gateway.observe.metrics import counter_family
from gateway.observe.otlp import RequestSpans, UnsupportedSpan, encode_request_spans, export_request

log = logging.getLogger(__name__)


class TelemetryConfigError(ValueError):
    """An ``OTEL_*`` setting this gateway cannot honour; the message says what to change."""


class Tracing:
    """What spans need: sampler, ids, resource and scope; where they go: the OTLP exporter
    and/or SDK span processors (``console``, or a test's in-memory exporter)."""

    def __init__(self, provider: TracerProvider, processors: Sequence[SpanProcessor] = (),
                 exporter: OtlpHttpExporter | None = None) -> None:
        self.provider = provider
        self.sampler = provider.sampler
        self.ids = provider.id_generator
        self.resource = provider.resource
        self.scope = InstrumentationScope("switchyard.gateway", "0.1.0")
        self.processors = tuple(processors)
        for processor in self.processors:
            provider.add_span_processor(processor)
        self.exporter = exporter
        if exporter is not None:
            exporter.bind(self.resource, self.scope)

    @classmethod
    def create(cls, *, service_name: str = "switchyard-gateway",
               processors: Sequence[SpanProcessor] = (),
               exporter: OtlpHttpExporter | None = None) -> Tracing:
        detected = OTELResourceDetector().detect().attributes.get("service.name")
        resource = Resource.create({"service.name": str(detected or service_name)})
        # The sampler comes from OTEL_TRACES_SAMPLER / _ARG.
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        return cls(provider, processors, exporter)

    async def close(self) -> None:
        if self.exporter is not None:
            await self.exporter.close()
        await asyncio.to_thread(self.provider.shutdown)  # flushes the SDK processors


def tracing_from_env(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """The tracing the ``OTEL_*`` variables ask for, or None when it is off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = env.get("OTEL_TRACES_EXPORTER")
    if names is None:
        has_endpoint = _signal(env, "ENDPOINT")
        names = "otlp" if has_endpoint else "none"
    exporter: OtlpHttpExporter | None = None
    processors: list[SpanProcessor] = []
    for name in (n.strip().lower() for n in names.split(",") if n.strip()):
        if name == "otlp":
            exporter = OtlpHttpExporter.from_env(env)
        elif name == "console":
            processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name != "none":
            raise TelemetryConfigError(
                f"OTEL_TRACES_EXPORTER={names!r}: unknown exporter {name!r}; use otlp, console "
                "or none.")
    if exporter is None and not processors:
        return None
    return Tracing.create(processors=processors, exporter=exporter)


def _signal(env: Mapping[str, str], name: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    return env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}")


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    try:
        return float(raw) if raw else default
    except ValueError:
        raise TelemetryConfigError(f"{name}={raw!r} is not a number.") from None


class OtlpHttpExporter:
    """Batches encoded spans and POSTs them to an OTLP/HTTP receiver, from the event loop.

    ``add`` is called on the loop with one request's spans; a batch goes out when
    ``max_batch_spans`` are waiting or ``schedule_delay_s`` has passed. Past
    ``max_queue_spans`` waiting, spans are dropped and counted, never blocking a request.
    """

    def __init__(self, endpoint: str, *, headers: Mapping[str, str] | None = None,
                 timeout_s: float = 10.0, is_gzip: bool = False,
                 ssl_context: ssl.SSLContext | None = None, schedule_delay_s: float = 5.0,
                 max_queue_spans: int = 2048, max_batch_spans: int = 512) -> None:
        self.endpoint = endpoint
        self.headers = {"Content-Type": "application/x-protobuf", **(headers or {})}
        if is_gzip:
            self.headers["Content-Encoding"] = "gzip"
        self.timeout_s = timeout_s
        self.is_gzip = is_gzip
        self.ssl_context = ssl_context
        self.schedule_delay_s = schedule_delay_s
        self.max_queue_spans = max_queue_spans
        self.max_batch_spans = max_batch_spans
        self.num_exported = self.num_dropped = self.num_failed = 0
        self._pending: deque[tuple[RequestSpans, int]] = deque()
        self._num_pending = 0
        self._wakeup: asyncio.Event | None = None
        self._resource = Resource.get_empty()
        self._scope: InstrumentationScope | None = None
        self._closed = False
        self._last_error_s = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OtlpHttpExporter:
        protocol = _signal(env, "PROTOCOL") or "http/protobuf"
        if protocol.strip().lower() != "http/protobuf":
            raise TelemetryConfigError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported: switchyard exports "
                "OTLP over HTTP; set it to 'http/protobuf' and point OTEL_EXPORTER_OTLP_ENDPOINT "
                "at the collector's HTTP port (usually 4318).")
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or (
            (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318").rstrip("/")
            + "/v1/traces")
        headers = {}
        for item in (_signal(env, "HEADERS") or "").split(","):
            key, sep, value = item.partition("=")
            if sep and key.strip():
                headers[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
        compression = (_signal(env, "COMPRESSION") or "none").strip().lower()
        if compression not in ("none", "gzip"):
            raise TelemetryConfigError(
                f"OTEL_EXPORTER_OTLP_COMPRESSION={compression!r}: use gzip or none.")
        certificate = _signal(env, "CERTIFICATE")
        return cls(
            endpoint, headers=headers,
            timeout_s=_number(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                              _number(env, "OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)) / 1000,
            is_gzip=compression == "gzip",
            ssl_context=ssl.create_default_context(cafile=certificate) if certificate else None,
            schedule_delay_s=_number(env, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000,
            max_queue_spans=int(_number(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)),
            max_batch_spans=int(_number(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
        )

    def collect_metrics(self) -> Iterator[object]:
        """Spans exported, dropped (queue full) and failed (the receiver refused or was down)."""
        for outcome, doc in (("exported", "Spans the OTLP receiver accepted."),
                             ("dropped", "Spans dropped because the export queue was full."),
                             ("failed", "Spans lost because an export request failed.")):
            yield counter_family(f"switchyard_trace_spans_{outcome}", doc, None,
                                 float(getattr(self, f"num_{outcome}")))

    def bind(self, resource: Resource, scope: InstrumentationScope) -> None:
        self._resource, self._scope = resource, scope

    def add(self, spans: RequestSpans, num_spans: int) -> None:
        """One request's spans; they are encoded when their batch is sent, together, which
        keeps the encoder's code and caches warm and the request path short."""
        if self._num_pending + num_spans > self.max_queue_spans or self._closed:
            self.num_dropped += num_spans
            return
        self._pending.append((spans, num_spans))
        self._num_pending += num_spans
        if self._num_pending >= self.max_batch_spans and self._wakeup is not None:
            self._wakeup.set()

    async def run(self) -> None:
        """Send batches until ``close``; one request in flight at a time."""
        self._wakeup = wakeup = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=1, ssl=self.ssl_context or True)
        async with aiohttp.ClientSession(connector=connector) as session:
            while not self._closed or self._pending:
                if not self._closed and self._num_pending < self.max_batch_spans:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wakeup.wait(), self.schedule_delay_s)
                wakeup.clear()
                await self._send(session)

    async def close(self) -> None:
        self._closed = True
        if self._wakeup is not None:
            self._wakeup.set()

    async def _send(self, session: aiohttp.ClientSession) -> None:
        batch, num_spans = [], 0
        while self._pending and num_spans < self.max_batch_spans:
            spans, count = self._pending.popleft()
            batch.append(spans)
            num_spans += count
        self._num_pending -= num_spans
        if not batch:
            return
        try:
            framed = b"".join([encode_request_spans(spans) for spans in batch])
        except UnsupportedSpan as exc:  # an attribute of a type OTLP has no value for
            self.num_failed += num_spans
            log.warning("cannot encode spans for OTLP: %s", exc)
            return
        body = export_request(self._resource, self._scope, framed)
        if self.is_gzip:
            body = gzip.compress(body)
        try:
            async with session.post(self.endpoint, data=body, headers=self.headers,
                                    timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as reply:
                await reply.read()
                if reply.status >= 300:
                    raise aiohttp.ClientResponseError(reply.request_info, (), status=reply.status)
            self.num_exported += num_spans
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.num_failed += num_spans
            now_s = time.monotonic()
            if now_s - self._last_error_s > 60:  # a collector that is down logs once a minute
                self._last_error_s = now_s
                log.warning("OTLP export to %s failed (%s): %d spans dropped so far",
                            self.endpoint, exc, self.num_failed)
