"""Run the gateway: uvloop, a graceful drain on SIGTERM, and OpenAI-format HTTP parse errors.

On SIGTERM or SIGINT the gateway stops accepting connections, reports not-ready, lets in-flight
requests and streams finish for up to ``drain_timeout_s``, then cancels what is left and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from gateway.app import create_app
from gateway.context import CONFIG_PATH, GATEWAY, Gateway
from gateway.errors import error_body
from gateway.front import new_request_id
from gateway.handlers import serve_own_metrics
from gateway.observe.logs import RateLimitFilter
from gateway.relay import DrainDeadline
from gateway.reload import reload_from_signal
from gateway.settings import Settings
from gateway.workers import WORKER_ROLE, WorkerRole
from routing import native

log = logging.getLogger(__name__)

OnStarted = Callable[[web.Application, str], Awaitable[None]]
"""Called once the gateway listens, with the app and its base URL (``switchyard serve
--backend`` creates its tenant and prints its banner here)."""


class _JsonErrorRequestHandler(RequestHandler):
    """aiohttp answers unparsable HTTP itself, in plain text; answer in OpenAI's format."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        self.log_debug("bad request from %s: %s", request.remote, exc)
        reason = "the request could not be parsed as HTTP"
        if isinstance(exc, LineTooLong):
            # its message quotes the client's bytes; say what to change instead
            reason = f"{reason}: a request or header line is longer than {exc.args[1]} bytes"
        elif status != 500 and message:
            reason = f"{reason}: {message.splitlines()[0][:200].rstrip(' :.')}"
        kind = "invalid_request_error" if status < 500 else "server_error"
        response = web.Response(
            status=status,
            body=error_body(
                f"Bad request: {reason}. Send well-formed HTTP/1.1: 'Name: value' header "
                "lines, with no CR, LF or NUL inside a value.", kind, "invalid_http",
            ),
            content_type="application/json",
            headers={"x-request-id": new_request_id()},  # like every other response
        )
        response.force_close()
        return response


    # -- slow clients: a request head must arrive within header_timeout_s ------------------
    header_timeout_s = 30.0  # set per server (``_JsonErrorServer``)
    _head_timer: asyncio.TimerHandle | None = None
    _head_count = 0
    _head_started = False  # bytes of a head that has not arrived whole

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that sends nothing at all is timed too

    def data_received(self, data: bytes) -> None:
        count = self._request_count
        super().data_received(data)
        if self._request_count != count:  # a head arrived: its body has its own timeout
            self._head_started = False
            self._disarm_head_timer()
        elif data and not self._task_handler_busy():
            self._head_started = True
            if self._head_timer is None:
                self._arm_head_timer()  # the first bytes of a next head, on a kept-alive one

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _task_handler_busy(self) -> bool:
        return bool(self._messages) or self._current_request is not None

    def _arm_head_timer(self) -> None:
        self._head_count = self._request_count
        self._head_timer = asyncio.get_running_loop().call_later(
            self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._request_count != self._head_count or self._task_handler_busy():
            return
        if self.transport is not None and not self.transport.is_closing():
            if self._head_started:  # a head begun and never finished: say so
                body = error_body(
                    f"The request head did not arrive within {self.header_timeout_s:g} s; "
                    "send it at once.", "invalid_request_error", "request_timeout")
                self.transport.write(
                    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: " + str(len(body)).encode()
                    + b"\r\n\r\n" + body)
            self.force_close()
            self.transport.close()


class _JsonErrorServer(Server):
    header_timeout_s = 30.0

    def __call__(self) -> RequestHandler:
        handler = _JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.header_timeout_s = self.header_timeout_s
        return handler


async def run_until_signalled(settings: Settings, *, ready_line: bool = True,
                              on_started: OnStarted | None = None,
                              config_path: Path | None = None,
                              worker: WorkerRole | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then drain. ``worker``: one of ``serve --workers``'s
    processes (``gateway.workers``), on the supervisor's port with ``SO_REUSEPORT``."""
    app = create_app(settings)
    if config_path is not None:
        app[CONFIG_PATH] = config_path
    if worker is not None:
        app[WORKER_ROLE] = worker
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        # The drain is ours (``_drain``); by the time aiohttp's shutdown runs, only handlers
        # still writing their last bytes are left.
        shutdown_timeout=FINAL_WRITE_S,
        handle_signals=False,
        keepalive_timeout=settings.listen.keepalive_timeout_s,
    )
    await runner.setup()
    if runner.server is not None and type(runner.server) is Server:
        runner.server.__class__ = _JsonErrorServer
        runner.server.header_timeout_s = settings.listen.header_timeout_s  # type: ignore[attr-defined]
    sock = _listen_socket(settings.listen.host,
                          settings.listen.port if worker is None else worker.port,
                          reuse_port=worker is not None)
    site = web.SockSite(runner, sock)
    await site.start()
    own_metrics = None if worker is None else await serve_own_metrics(app, worker)
    host, port = sock.getsockname()[:2]
    url_host = f"[{host}]" if ":" in host else host
    if ready_line:
        print(f"switchyard gateway listening on http://{host}:{port}", flush=True)
    log.info("decision modules: %s", native.STATUS)
    tune_gc()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload_from_signal, app)
    try:
        if on_started is not None:
            await on_started(app, f"http://{url_host}:{port}")
        await stop.wait()
        log.info("signal received: draining for up to %.0f s", settings.drain_timeout_s)
        app[GATEWAY].is_draining = True
        for running in list(runner.sites):
            await running.stop()  # no new connections; open ones finish what they carry
        await _drain(app[GATEWAY], settings.drain_timeout_s)
    finally:
        if own_metrics is not None:
            await own_metrics.cleanup()
        await runner.cleanup()
        log.info("gateway stopped")


FINAL_WRITE_S = 1.0  # after the drain: time for the last error events to be written


async def _drain(gw: Gateway, timeout_s: float) -> None:
    """Wait for the requests in flight, up to ``timeout_s``; then end every stream still open
    with an error event (the client learns why its answer is incomplete) rather than cutting
    it, and give those events ``FINAL_WRITE_S`` to go out."""
    if not gw.num_in_flight:
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await gw.drained.wait()
        return
    log.warning("drain time over: ending %d stream(s) and %d request(s) in flight",
                len(gw.streams), gw.num_in_flight)
    for upstream in list(gw.streams):
        upstream.interrupt(DrainDeadline())
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(FINAL_WRITE_S):
            await gw.drained.wait()


def _listen_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # one of several workers on the port: the kernel spreads connections
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


# Allocations between young-generation collections: a request allocates a few hundred
# objects that die with it (CPython's default, 700, collects every request or two).
GC_YOUNG_THRESHOLD = 20_000


def tune_gc() -> None:
    """Once serving: what start-up made (modules, settings, tokenizers) moves out of the
    collector's generations for good (``gc.freeze``), and young collections run every
    ``GC_YOUNG_THRESHOLD`` allocations. Together about 3 % less CPU per request
    (docs/benchmarks/overhead.md); cycles are still collected."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def serve(settings: Settings, **kwargs: Any) -> None:
    worker = kwargs.get("worker")
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s " + ("" if worker is None else f"w{worker.index} ")
        + "%(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:  # an outage is one line per cause, not a flood
        handler.addFilter(RateLimitFilter())
    uvloop.run(run_until_signalled(settings, **kwargs))
