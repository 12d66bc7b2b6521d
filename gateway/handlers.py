"""Small endpoints: models, liveness, readiness, metrics."""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from backends.redis_url import REDIS_ERRORS
from gateway.auth import credentials
from gateway.context import GATEWAY, Gateway
from gateway.errors import APIError
from gateway.observe.worker_metrics import OWN_PATH, merged_metrics, socket_path
from gateway.workers import WORKER_ROLE, WorkerRole

_STARTED_AT = int(time.time())


async def list_models(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    principal = await gw.auth.authenticate(credentials(request.headers))
    names = dict.fromkeys([*gw.registry.models(), *gw.aliases.names])  # served, then aliases
    data = [
        {"id": model, "object": "model", "created": _STARTED_AT, "owned_by": "switchyard"}
        for model in names
        if principal.tenant.may_use(model)
    ]
    return _json({"object": "list", "data": data})


async def get_model(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    principal = await gw.auth.authenticate(credentials(request.headers))
    model = request.match_info["model"]
    known = gw.registry.serves(model) or model in gw.aliases
    if not known or not principal.tenant.may_use(model):
        raise APIError.not_found(
            f"The model {model!r} does not exist or you do not have access to it.",
            code="model_not_found", param="model",
        )
    return _json({"id": model, "object": "model", "created": _STARTED_AT, "owned_by": "switchyard"})


async def healthz(request: web.Request) -> web.Response:
    return _json({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    problems = []
    if gw.is_draining:
        problems.append("the gateway is shutting down")
    if gw.redis is not None:  # None: the state is in this process
        try:
            async with asyncio.timeout(0.5):
                await gw.redis.ping()
        except REDIS_ERRORS as exc:
            problems.append(f"Redis unreachable ({exc.__class__.__name__})")
    healthy = [b.name for b in gw.registry.backends if b.is_healthy]
    if not healthy:
        problems.append("no healthy backend")
    if problems:
        raise APIError(503, "Not ready: " + "; ".join(problems) + ".",
                       type="service_unavailable", code="not_ready")
    return _json({"status": "ready", "healthy_backends": healthy})


BREAKER_STATES = ("closed", "open", "half_open")


async def metrics(request: web.Request) -> web.Response:
    """This process's metrics; under ``serve --workers``, every worker's, with a ``worker``
    label (``gateway.observe.worker_metrics``)."""
    body = own_metrics(request.app[GATEWAY])
    role = request.app.get(WORKER_ROLE)
    if role is not None and role.num_workers > 1:
        body, _ = await merged_metrics(body.decode(), index=role.index,
                                       num_workers=role.num_workers,
                                       socket_dir=role.socket_dir)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def own_metrics(gw: Gateway) -> bytes:
    for backend in gw.registry.backends:
        gw.metrics.backend_healthy.labels(backend.name).set(1 if backend.is_healthy else 0)
        gw.metrics.breaker_state.labels(backend.name).set(
            BREAKER_STATES.index(backend.breaker.state))
    gw.metrics.in_flight.set(gw.num_in_flight)
    return bytes(generate_latest(gw.metrics.registry))


async def serve_own_metrics(app: web.Application, role: WorkerRole) -> web.AppRunner:
    """A worker's own metrics on its Unix socket, for its siblings' scrapes."""
    gw = app[GATEWAY]

    async def own(request: web.Request) -> web.Response:
        return web.Response(body=own_metrics(gw), headers={"Content-Type": CONTENT_TYPE_LATEST})

    sibling_app = web.Application()
    sibling_app.router.add_get(OWN_PATH, own)
    runner = web.AppRunner(sibling_app, access_log=None)
    await runner.setup()
    path = socket_path(role.socket_dir, role.index)
    path.unlink(missing_ok=True)  # a restarted worker's predecessor left it
    await web.UnixSite(runner, str(path)).start()
    return runner


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
