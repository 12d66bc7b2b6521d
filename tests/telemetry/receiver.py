"""A small OTLP/HTTP trace receiver for tests: decodes each ExportTraceServiceRequest.

It runs its own event loop in a thread, so synchronous tests can use it too. Example::

    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, ...}
        ...
        spans = receiver.wait_for(lambda spans: len(spans) >= 3)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from gateway.cli.localproc import free_port


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int  # OTLP: 1 internal, 2 server, 3 client
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    service=str(resource.get("service.name")), trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(),
                    name=span.name, kind=span.kind, start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    attributes={kv.key: _value(kv.value) for kv in span.attributes}))
    return spans


class OtlpReceiver:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.spans: list[ReceivedSpan] = []
        self.num_requests = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        spans = decode(await request.read())
        with self._lock:
            self.spans.extend(spans)
            self.num_requests += 1
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool],
                 timeout_s: float = 10.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)
