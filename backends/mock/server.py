"""The mock engine's aiohttp app: OpenAI completion endpoints plus health, metrics and test hooks.

Run it with ``handler_cancellation=True`` (as `backends.mock.runner` does) so a
client that goes away cancels its handler and is counted as cancelled.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web

from backends.embeddings import HASHED_DIMS, embeddings_body, hashed_embedding
from backends.engine_http import (
    DONE_EVENT,
    HEALTH_BODY,
    JSON_CONTENT_TYPE,
    MAX_REQUEST_BODY_BYTES,
    SSE_HEADERS,
    BadBody,
    add_openai_routes,
    check_embeddings,
    json_response,
    models_page,
    new_completion_id,
    read_json,
)
from backends.mock.config import MockEngineConfig
from backends.mock.errors import RequestError
from backends.mock.parse import CompletionRequest, parse_request
from backends.mock.stats import METRICS_CONTENT_TYPE, MockStats, Outcome, render_metrics
from backends.mock.wire import response_body, stream_plan

CONFIG_KEY = web.AppKey("mock_config", MockEngineConfig)
STATS_KEY = web.AppKey("mock_stats", MockStats)
MODELS_BODY_KEY = web.AppKey("mock_models_body", bytes)



def create_app(config: MockEngineConfig) -> web.Application:
    """The mock engine app for ``config``; serve it with `backends.mock.start` or `run`."""
    app = web.Application(client_max_size=MAX_REQUEST_BODY_BYTES)
    app[CONFIG_KEY] = config
    app[STATS_KEY] = MockStats()
    app[MODELS_BODY_KEY] = _models_body(config.models, created_s=int(time.time()))
    add_openai_routes(app, _serve_completion, models=_models, health=_health, metrics=_metrics,
                      embeddings=_serve_embeddings)
    app.router.add_get("/mock/stats", _mock_stats)
    app.router.add_post("/mock/reset", _mock_reset)
    return app


async def _serve_completion(request: web.Request, is_chat: bool) -> web.StreamResponse:
    stats = request.app[STATS_KEY]
    stats.start()
    outcome: Outcome = "completed"
    try:
        response, outcome = await _complete(request, stats, is_chat=is_chat)
        return response
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        stats.finish(outcome)


async def _serve_embeddings(request: web.Request) -> web.StreamResponse:
    """Vectors derived from each input's text (``backends.embeddings.hashed_embedding``), a
    token per word (or token id), at once."""
    stats = request.app[STATS_KEY]
    stats.start()
    outcome: Outcome = "completed"
    try:
        stats.last_headers = request.headers
        stats.last_body = None
        try:
            stats.last_body = body = await read_json(request)
            parsed = check_embeddings(body, request.app[CONFIG_KEY].models, HASHED_DIMS)
        except BadBody as exc:
            return exc.response
        num_tokens = sum(len(i) if isinstance(i, tuple) else max(1, len(i.split()))
                         for i in parsed.inputs)
        vectors = [hashed_embedding(text, HASHED_DIMS) for text in parsed.texts]
        return web.Response(body=embeddings_body(parsed, vectors, num_tokens),
                            content_type=JSON_CONTENT_TYPE)
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        stats.finish(outcome)


async def _complete(
    request: web.Request, stats: MockStats, *, is_chat: bool
) -> tuple[web.StreamResponse, Outcome]:
    stats.last_headers = request.headers
    stats.last_body = None
    try:
        stats.last_body = orjson.loads(await request.read())
        req = parse_request(stats.last_body, is_chat=is_chat, config=request.app[CONFIG_KEY])
    except orjson.JSONDecodeError as exc:
        return _error_response(RequestError(400, f"The body is not valid JSON: {exc}")), "completed"
    except RequestError as exc:
        return _error_response(exc), "completed"

    controls = req.controls
    if controls.hang_ms > 0:
        waiting = stats.num_waiting_by_model
        waiting[req.model] = waiting.get(req.model, 0) + 1
        try:
            await asyncio.sleep(controls.hang_ms / 1000)
        finally:
            waiting[req.model] -= 1
    running = stats.num_running_by_model
    running[req.model] = running.get(req.model, 0) + 1
    try:
        if controls.status is not None:
            message = f"Injected by the mock engine ('mock.status': {controls.status})."
            error = RequestError(controls.status, message, code="mock_injected")
            return _error_response(error), "completed"
        if req.is_stream:
            response, outcome = await _stream(request, req)
        else:
            response, outcome = await _respond_whole(request, req)
        if outcome == "completed":
            stats.record_success(req.model, req.finish_reason)
        return response, outcome
    finally:
        running[req.model] -= 1


async def _respond_whole(
    request: web.Request, req: CompletionRequest
) -> tuple[web.StreamResponse, Outcome]:
    controls = req.controls
    if controls.die_after_chunks is not None:
        _abort(request)
        return web.Response(), "aborted"
    delay_ms = controls.first_token_delay_ms + req.max_tokens * controls.token_delay_ms
    if delay_ms > 0:
        await asyncio.sleep(delay_ms / 1000)
    body = response_body(req, new_completion_id(req.is_chat), int(time.time()))
    return web.Response(body=body, content_type=JSON_CONTENT_TYPE), "completed"


async def _stream(
    request: web.Request, req: CompletionRequest
) -> tuple[web.StreamResponse, Outcome]:
    die_after_chunks = req.controls.die_after_chunks
    response = web.StreamResponse(headers=SSE_HEADERS)
    plan = stream_plan(req, new_completion_id(req.is_chat), int(time.time()))
    try:
        await response.prepare(request)
        for num_chunks_sent, (delay_s, event) in enumerate(plan):
            if num_chunks_sent == die_after_chunks:
                break
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            # aiohttp hands each write straight to the transport (TCP_NODELAY is on).
            await response.write(event)
        if die_after_chunks is not None:
            _abort(request)
            return response, "aborted"
        await response.write(DONE_EVENT)
    except ConnectionResetError:  # the client went away between two writes
        return response, "cancelled"
    return response, "completed"


def _abort(request: web.Request) -> None:
    """Drop the connection with no further bytes, like a crashed engine."""
    if request.transport is not None:
        request.transport.abort()


def _error_response(error: RequestError) -> web.Response:
    body = orjson.dumps(error.body())
    return web.Response(status=error.status, body=body, content_type=JSON_CONTENT_TYPE)


def _models_body(models: tuple[str, ...], *, created_s: int) -> bytes:
    return orjson.dumps(models_page(models, created_s=created_s))


async def _models(request: web.Request) -> web.Response:
    return web.Response(body=request.app[MODELS_BODY_KEY], content_type=JSON_CONTENT_TYPE)


async def _health(request: web.Request) -> web.Response:
    return json_response(HEALTH_BODY)


async def _metrics(request: web.Request) -> web.Response:
    if not request.app[CONFIG_KEY].serves_metrics:
        raise web.HTTPNotFound()
    text = render_metrics(request.app[STATS_KEY], request.app[CONFIG_KEY].models)
    return web.Response(body=text.encode(), headers={"Content-Type": METRICS_CONTENT_TYPE})


async def _mock_stats(request: web.Request) -> web.Response:
    body = orjson.dumps(request.app[STATS_KEY].snapshot())
    return web.Response(body=body, content_type=JSON_CONTENT_TYPE)


async def _mock_reset(request: web.Request) -> web.Response:
    stats = request.app[STATS_KEY]
    stats.reset()
    return web.Response(body=orjson.dumps(stats.snapshot()), content_type=JSON_CONTENT_TYPE)
