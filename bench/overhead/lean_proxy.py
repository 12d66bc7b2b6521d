"""The gateway's own floor: aiohttp's server and the gateway's upstream client
(``backends.fleet.http1``), no features: what switchyard's data plane costs before auth,
quota, admission, routing, telemetry and usage. ``bench.overhead.ablation`` measures the
gateway's features over it::

    python -m bench.overhead.lean_proxy --port 18081 --upstream http://127.0.0.1:19001
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import AsyncIterator

import uvloop
from aiohttp import web

from backends.fleet.http1 import Pool

UPSTREAM = web.AppKey("upstream", str)
POOL = web.AppKey("pool", Pool)
_JSON_HEADERS = {"Content-Type": "application/json"}


async def _forward(request: web.Request) -> web.Response:
    body = await request.read()
    pool = request.app[POOL]
    response = await pool.send(pool.head(request.path, len(body), _JSON_HEADERS), body)
    await response.wait_head()
    answer = await response.read()
    return web.Response(status=response.status, body=answer,
                        headers={"Content-Type": response.content_type or "application/json"})


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def create_app(upstream_url: str) -> web.Application:
    app = web.Application()

    async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
        pool = app[POOL] = Pool(upstream_url, max_connections=1024, connect_timeout_s=5.0)
        yield
        pool.close()

    app.cleanup_ctx.append(pool_ctx)
    app.router.add_post("/v1/chat/completions", _forward)
    app.router.add_get("/health", _health)
    return app


async def _serve(host: str, port: int, upstream_url: str) -> None:
    runner = web.AppRunner(create_app(upstream_url), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"lean proxy listening on http://{host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args(argv)
    uvloop.run(_serve(args.host, args.port, args.upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
