"""The telemetry's place in the app: tracing and the wait histograms set up and torn down with
it (``setup_telemetry``), and ``GET /admin/waits``.

Apart from ``gateway.observe.telemetry`` (what each request runs), which is compiled with the
hot path (``routing.native``): an async generator, as aiohttp's cleanup context is, cannot be.

Example::

    app = web.Application()
    setup_gateway(app, settings)
    setup_telemetry(app)
    app.router.add_get("/admin/waits", admin_waits)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
from aiohttp import web

from gateway.admin import _admin as require_admin
from gateway.context import GATEWAY
from gateway.errors import APIError
from gateway.observe.telemetry import TELEMETRY, Telemetry
from gateway.observe.tracing import tracing_from_env
from gateway.observe.wait_metrics import WaitMetrics


def setup_telemetry(app: web.Application) -> None:
    """Tracing from ``OTEL_*``, wait histograms on the gateway's registry, connection hooks.

    Call after ``setup_gateway``: its objects exist when this starts, and spans are flushed
    before they are torn down.
    """
    app[TELEMETRY] = Telemetry(tracing_from_env())

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        telemetry = app[TELEMETRY]  # a test may have put its own here
        gw = app[GATEWAY]
        telemetry.metrics = WaitMetrics(gw.metrics, gw.settings.tier_names)
        tracing = telemetry.tracing
        exporter = tracing.exporter if tracing is not None else None
        exporting = None
        if exporter is not None:
            gw.metrics.add_source(exporter.collect_metrics)
            exporting = asyncio.create_task(exporter.run(), name="otlp-export")
        try:
            yield
        finally:
            if tracing is not None:
                await tracing.close()
            if exporting is not None and exporter is not None:
                # It sends what the last requests left, unless the collector does not answer.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(exporting, exporter.timeout_s)

    app.cleanup_ctx.append(lifecycle)


async def admin_waits(request: web.Request) -> web.Response:
    """GET /admin/waits[?window_s=N]: the waits report (see ``gateway.observe.waits``)."""
    require_admin(request)
    window_s = None
    raw = request.query.get("window_s")
    if raw is not None:
        try:
            window_s = float(raw)
        except ValueError:
            window_s = -1.0
        if not window_s > 0:
            raise APIError.bad_request(f"window_s must be a positive number of seconds, got "
                                       f"{raw!r}.", param="window_s")
    report = request.app[TELEMETRY].report(window_s)
    return web.Response(body=orjson.dumps(report), content_type="application/json")
