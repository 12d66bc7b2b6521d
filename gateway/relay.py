"""Relaying an engine's answer to the client: a whole body, or an SSE stream spliced chunk by
chunk from the upstream connection's data callback to the client's socket (``_Splice``), with
each client API's end of stream and error event (``gateway.apis``).

Example::

    response = await relay_stream(request, gw, opened, ticket, served, api=API_OF_ROUTE[route])
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from http import HTTPStatus

import aiohttp
from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE

from backends.fleet.http1 import UpstreamBroken
from backends.fleet.registry import Backend
from backends.fleet.upstream import Opened
from gateway.admit import QuotaTicket, renew_lease
from gateway.apis import API_OF_ROUTE, OPENAI, Api, EventHeads
from gateway.context import CLIENT_LEFT, REQUEST_ID, Gateway
from gateway.errors import APIError
from gateway.observe.telemetry import REQUEST_TRACE
from gateway.routes import ROUTE_PATHS

log = logging.getLogger(__name__)

_REASONS = {status.value: status.phrase for status in HTTPStatus}
MODEL_HEADER = "x-switchyard-model"  # the served model: the one asked for, or an alias's
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no"}
# Every engine serves these; the others an engine may lack (a 404 says so).
CORE_ROUTES = frozenset({"chat", "completions"})


def failed_on(gw: Gateway, backend: Backend, reason: str) -> None:
    """A request failed on ``backend``: its breaker counts it (and may eject it)."""
    if gw.registry.request_failed(backend, reason, time.monotonic()):
        gw.metrics.ejections.labels(backend.name).inc()


async def relay_body(
    request: web.Request, gw: Gateway, route: str, opened: Opened, ticket: QuotaTicket,
    served: str,
) -> web.Response:
    upstream = opened.response
    body = opened.first_chunk  # the whole body (read by open()), unless a stream was answered
    if not upstream.is_eof():  # with a 200 that is not SSE: read the rest
        try:
            async with asyncio.timeout(gw.settings.upstream.request_timeout_s):
                body += await upstream.read()
        except (TimeoutError, UpstreamBroken, OSError):
            gw.metrics.upstream_errors.labels(opened.backend.name, "protocol").inc()
            failed_on(gw, opened.backend, "broken_body")
            raise APIError.bad_gateway(
                f"Upstream failed: backend {opened.backend.name!r} broke off its response."
            ) from None
    api = API_OF_ROUTE[route]
    if upstream.status >= 400:
        if not api.is_error_body(body):
            if upstream.status in (404, 405) and route not in CORE_ROUTES:
                raise APIError.not_found(
                    f"The backend {opened.backend.name!r} serving {served!r} does not offer "
                    f"{ROUTE_PATHS[route]}; not every engine has it (vLLM and SGLang do).",
                    code="unsupported_endpoint")
            gw.metrics.upstream_errors.labels(opened.backend.name,
                                              f"http_{upstream.status}").inc()
            raise APIError.bad_gateway(
                f"Upstream failed: backend {opened.backend.name!r} answered HTTP "
                f"{upstream.status} without an error body."
            )
        body = api.client_error_body(upstream.status, body)
    headers = {"Content-Type": upstream.headers.get("content-type", "application/json"),
               MODEL_HEADER: served}
    if gw.settings.routing.expose_backend_header:
        headers["x-switchyard-backend"] = opened.backend.name
    if ticket.is_limited:
        headers.update(ticket.headers)
    headers["x-request-id"] = request[REQUEST_ID]
    ticket.num_output_tokens = api.output_tokens(body[-512:] if api.is_openai else body[-4096:],
                                                 0)
    request[REQUEST_TRACE].tail = body
    # Sent here, not by aiohttp after the handler returns: the bookkeeping of the handler's
    # finally blocks (routing's and admission's counts, quota, metrics, usage) then runs
    # after the client has its answer, off its latency.
    try:
        sent = write_whole(request, upstream.status, headers, body)
        if sent is not None:
            return sent
        response = web.Response(status=upstream.status, body=body, headers=headers)
        await response.prepare(request)
        await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        gw.metrics.client_disconnects.inc()  # gone before its answer: nothing more to send
        request[CLIENT_LEFT] = True
        response = _marked_sent(upstream.status, 0)
    return response


def write_whole(request: web.Request, status: int, headers: dict[str, str], body: bytes
                ) -> web.Response | None:
    """Write a whole answer to the client's socket in one piece, head and body: what
    aiohttp's ``Response.prepare`` and ``write_eof`` do, without their header multidict, its
    serialisation and the writer's bookkeeping (about 7 CPU-µs per answer on the 2-core VM,
    ``docs/benchmarks/overhead.md``). Returns the response the handler returns, marked sent,
    so that aiohttp writes nothing more and keeps the connection; None where aiohttp must
    write it: not HTTP/1.1 keep-alive, a status without a body, or a header value with a
    line break (aiohttp refuses those). Raises ConnectionResetError when the client left."""
    if request.version != aiohttp.HttpVersion11 or not request.keep_alive \
            or not 200 <= status < 600 or status in (204, 304):
        return None
    values = "".join(headers.values())
    if "\r" in values or "\n" in values:
        return None
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client closed the connection")
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nDate: {rfc822_formatted_time()}"
             f"\r\nServer: {SERVER_SOFTWARE}\r\nContent-Length: {len(body)}\r\n"]
    for name, value in headers.items():
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    transport.write("".join(lines).encode("latin-1", "replace") + body)
    return _marked_sent(status, len(body))


def _marked_sent(status: int, num_bytes: int) -> web.Response:
    """A response aiohttp takes for written: it sends nothing of it, and keeps the connection
    unless the client closed it."""
    response = web.Response(status=status)
    response._keep_alive = True  # what aiohttp's RequestHandler reads after the handler
    response._eof_sent = True  # prepare() and write_eof() are no-ops from here
    response._body_length = num_bytes
    return response


async def relay_stream(
    request: web.Request, gw: Gateway, opened: Opened, ticket: QuotaTicket, served: str,
    ending_at_events: int | None = None, on_ending: Callable[[], None] | None = None,
    api: Api = OPENAI,
) -> web.StreamResponse:
    """Relay an SSE stream. After the first chunk (written with the response head), every
    chunk goes from the upstream connection's data callback straight to the client's socket
    (``_Splice``): no task switch, timer move or coroutine per chunk. This task only wakes for
    the end, a full client buffer, the idle timer, or a failure."""
    settings = gw.settings.upstream
    out = web.StreamResponse(status=200, headers=_SSE_HEADERS)
    out.headers["x-request-id"] = request[REQUEST_ID]
    out.headers[MODEL_HEADER] = served
    if gw.settings.routing.expose_backend_header:
        out.headers["x-switchyard-backend"] = opened.backend.name
    if ticket.is_limited:
        out.headers.update(ticket.headers)
    if request.version >= aiohttp.HttpVersion11:
        out.enable_chunked_encoding()  # made explicit: the splice writes the chunk framing
    writer = await out.prepare(request)
    assert writer is not None
    upstream = opened.response
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + settings.request_timeout_s
    idle_s = settings.idle_timeout_s
    splice = _Splice(loop, ticket, renew_every_s=gw.settings.admission.lease_ttl_s / 3,
                     ending_at_events=ending_at_events, on_ending=on_ending,
                     api=None if api.is_openai else api)
    gw.streams.add(upstream)
    # Why the stream ends with an error event: (message, kind, code), written after the
    # ``try``, not in its handlers (compiled, an await in an except block corrupts the
    # exception state of other coroutines: tests/routing/test_native.py).
    failure: tuple[str, str, str] | None = None
    try:
        # The head goes out with the first chunk (aiohttp holds it back until a write; an
        # empty one sends the head alone), before any chunk is written to the socket directly.
        splice.count(opened.first_chunk)
        await out.write(opened.first_chunk)
        transport = request.transport
        if transport is None:
            raise ConnectionResetError
        splice.start(transport, out.chunked)
        upstream.splice(splice)
        while not upstream.is_complete:
            if splice.is_client_gone:
                raise ConnectionResetError
            wake_s = min(splice.last_chunk_s + idle_s, deadline_s)
            if loop.time() >= wake_s:
                raise TimeoutError
            try:
                async with asyncio.timeout_at(wake_s):
                    await upstream.wait_spliced()
            except TimeoutError:
                continue  # chunks may have come meanwhile: the loop looks again
            if upstream.is_paused and not splice.is_client_gone:
                try:  # the client reads slowly: let its buffer empty, for idle_s at most
                    async with asyncio.timeout(idle_s):
                        await writer.drain()
                except TimeoutError:
                    log.info("request %s: the client read nothing for %.0f s; closing",
                             request[REQUEST_ID], idle_s)
                    transport.abort()
                    raise ConnectionResetError from None
                upstream.resume_reading()
    except TimeoutError:
        gw.metrics.upstream_errors.labels(opened.backend.name, "idle_timeout").inc()
        failed_on(gw, opened.backend, "idle_timeout")
        failure = (f"Upstream timeout: backend {opened.backend.name!r} stalled.",
                   "upstream_error", "upstream_failed")
    except DrainDeadline:
        failure = ("The gateway is shutting down and its drain time is over; the response is "
                   "incomplete: retry the request.", "service_unavailable",
                   "gateway_shutting_down")
    except UpstreamBroken as exc:
        gw.metrics.upstream_errors.labels(opened.backend.name, "broken_stream").inc()
        failed_on(gw, opened.backend, "broken_stream")
        failure = (f"Upstream failed: backend {opened.backend.name!r} broke off the stream "
                   f"({exc}); the response is incomplete.", "upstream_error", "upstream_failed")
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        gw.metrics.client_disconnects.inc()  # the client went away while we wrote
        request[CLIENT_LEFT] = True
        return out
    else:
        heads = splice.event_heads
        if (b"data: [DONE]" in splice.previous[-64:] + splice.tail[-64:] if heads is None
                else api.is_stream_end(heads.head, splice.previous[-256:] + splice.tail[-256:])):
            await out.write_eof()
        else:  # a clean end without its last event: the engine stopped short
            gw.metrics.upstream_errors.labels(opened.backend.name, "no_done").inc()
            failed_on(gw, opened.backend, "no_done")
            await _end_with_error(
                out, api, f"Upstream failed: backend {opened.backend.name!r} ended the stream "
                f"without {api.end_name}; the response may be incomplete.")
    finally:
        gw.streams.discard(upstream)
        gw.metrics.streamed_chunks.inc(splice.num_chunks)
        tail = splice.previous[-2048:] + splice.tail[-2048:]
        ticket.num_output_tokens = api.output_tokens(tail, splice.num_events)
        request[REQUEST_TRACE].streamed(tail, ticket.num_output_tokens)
    if failure is not None:
        await _end_with_error(out, api, failure[0], kind=failure[1], code=failure[2])
    return out


class _Splice:
    """The sink of a spliced stream: counts each chunk, keeps the last two (a usage event may
    come just before [DONE]), writes it to the client in HTTP/1.1 chunked framing, notes the
    time for the idle timer and renews a long stream's quota lease. Called inside the upstream
    connection's data callback, so it never raises: a client that has gone is only noted (its
    handler is being cancelled), and a full client buffer asks the upstream to pause."""

    __slots__ = ("_ending_at_events", "_is_chunked", "_loop", "_next_renew_s", "_on_ending",
                 "_renew_every_s", "_ticket", "_transport", "event_heads", "is_client_gone",
                 "last_chunk_s", "num_chunks", "num_events", "previous", "tail")

    def __init__(self, loop: asyncio.AbstractEventLoop, ticket: QuotaTicket,
                 renew_every_s: float, ending_at_events: int | None = None,
                 on_ending: Callable[[], None] | None = None, api: Api | None = None) -> None:
        self._loop = loop
        # Messages and Responses streams: the latest event's head is followed, to judge the
        # stream's end by its last event, which may be far longer than a chunk
        # (response.completed holds the whole response). OpenAI streams end with [DONE],
        # which the handler finds in the last bytes.
        self.event_heads = None if api is None else EventHeads()
        # At this many events the stream has one token left: ``on_ending`` runs, once.
        self._ending_at_events = (ending_at_events if ending_at_events is not None
                                  and on_ending is not None else _NEVER)
        self._on_ending = on_ending
        self._ticket = ticket
        self._transport: asyncio.Transport | None = None
        self._is_chunked = True
        self._renew_every_s = renew_every_s
        self.last_chunk_s = now_s = loop.time()
        self._next_renew_s = now_s + renew_every_s if ticket.needs_lease else float("inf")
        self.is_client_gone = False
        self.num_chunks = self.num_events = 0
        self.tail = self.previous = b""

    def start(self, transport: asyncio.Transport, is_chunked: bool) -> None:
        self._transport = transport
        self._is_chunked = is_chunked

    def count(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.num_chunks += 1
        self.num_events += chunk.count(b"data: ")
        if self.event_heads is not None:
            self.event_heads.track(chunk)
        if self.num_events >= self._ending_at_events:
            self._ending_at_events = _NEVER
            if self._on_ending is not None:
                self._on_ending()
        self.previous, self.tail = self.tail, chunk
        self.last_chunk_s = now_s = self._loop.time()
        if now_s >= self._next_renew_s:  # a long stream keeps its lease
            renew_lease(self._ticket)
            self._next_renew_s = now_s + self._renew_every_s

    def __call__(self, chunk: bytes) -> bool:
        transport = self._transport
        if transport is None or transport.is_closing():
            self.is_client_gone = True
            return True  # pause the upstream; the handler returns and closes it
        self.count(chunk)
        if self._is_chunked:
            transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        else:
            transport.write(chunk)
        return transport.get_write_buffer_size() > _CLIENT_HIGH_WATER_BYTES


_NEVER = 1 << 62  # an event count no stream reaches
_CLIENT_HIGH_WATER_BYTES = 64 * 1024  # aiohttp's own drain limit for StreamResponse.write


class DrainDeadline(Exception):
    """Handed to the streams still open when a drain's time is up (``gateway.server``)."""


async def _end_with_error(out: web.StreamResponse, api: Api, message: str, *,
                          kind: str = "upstream_error", code: str = "upstream_failed") -> None:
    """Tell a streaming client what went wrong, in an SSE event its SDK raises on."""
    try:
        await out.write(api.stream_error(message, kind, code))
        await out.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass
