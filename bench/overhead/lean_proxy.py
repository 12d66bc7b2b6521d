"""The gateway's own floor: aiohttp's server and the gateway's upstream client
(``backends.fleet.http1``), no features: what switchyard's data plane costs before auth,
quota, admission, routing, telemetry and usage. ``bench.overhead.ablation`` measures the
gateway's features over it::

    python -m bench.overhead.lean_proxy --port 18081 --upstream http://127.0.0.1:19001
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

from aiohttp import web

from backends.fleet.http1 import Pool
from bench.overhead.bare_proxy import run_proxy

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


def main(argv: list[str] | None = None) -> int:
    return run_proxy(argv, __doc__ or "", "python -m bench.overhead.lean_proxy", create_app,
                     "lean proxy")


if __name__ == "__main__":
    sys.exit(main())
