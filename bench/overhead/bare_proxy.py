"""The floor for a Python proxy: aiohttp + uvloop pass-through, one shared ClientSession.

No auth, no Redis, no parsing, no metrics: it forwards the body to the upstream and relays the
answer (chunk by chunk for event streams). The overhead benchmark measures it beside the gateway
so the cost of switchyard's own features is visible apart from the machine's::

    python -m bench.overhead.bare_proxy --port 18080 --upstream http://127.0.0.1:19001
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Callable

import aiohttp
import uvloop
from aiohttp import web

UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)
_JSON_HEADERS = {"Content-Type": "application/json"}


async def _forward(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    session = request.app[SESSION]
    url = request.app[UPSTREAM] + request.path
    async with session.post(url, data=body, headers=_JSON_HEADERS) as upstream:
        if upstream.content_type != "text/event-stream":
            return web.Response(status=upstream.status, body=await upstream.read(),
                                headers={"Content-Type": upstream.content_type})
        out = web.StreamResponse(status=upstream.status,
                                 headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        async for chunk in upstream.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def create_app(upstream_url: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream_url.rstrip("/")

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                         skip_auto_headers=("User-Agent",)) as session:
            app[SESSION] = session
            yield

    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/chat/completions", _forward)
    app.router.add_post("/v1/completions", _forward)
    app.router.add_get("/health", _health)
    return app


async def serve_app(app: web.Application, host: str, port: int, name: str) -> None:
    """Serve ``app`` on ``host:port`` until SIGTERM or SIGINT."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"{name} listening on http://{host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run_proxy(argv: list[str] | None, doc: str, prog: str,
              create: Callable[[str], web.Application], name: str) -> int:
    """A proxy's command line (``--host``, ``--port``, ``--upstream``): serve
    ``create(upstream)``."""
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL of the engine")
    args = parser.parse_args(argv)
    uvloop.run(serve_app(create(args.upstream), args.host, args.port, name))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_proxy(argv, __doc__ or "", "python -m bench.overhead.bare_proxy", create_app,
                     "bare proxy")


if __name__ == "__main__":
    sys.exit(main())
