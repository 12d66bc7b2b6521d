"""The mock engine's aiohttp app: OpenAI completion endpoints, Anthropic's Messages and
OpenAI's Responses (answered as chat), plus health, metrics and test hooks.

Run it with ``handler_cancellation=True`` (as `backends.mock.runner` does) so a
client that goes away cancels its handler and is counted as cancelled.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

from backends.api_http import ApiCall, ApiCallRefused, api_call, api_error_response
from backends.embeddings import HASHED_DIMS, embeddings_body, hashed_embedding
from backends.engine_http import (
    DONE_EVENT,
    HEALTH_BODY,
    JSON_CONTENT_TYPE,
    MAX_REQUEST_BODY_BYTES,
    SSE_HEADERS,
    BadBody,
    ChatApiName,
    add_chat_api_routes,
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
from backends.mock.wire import api_body, api_stream_plan, response_body, stream_plan

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
    add_chat_api_routes(app, _serve_api)
    app.router.add_get("/mock/stats", _mock_stats)
    app.router.add_post("/mock/reset", _mock_reset)
    return app


async def _serve_completion(request: web.Request, is_chat: bool,
                            api: ChatApiName | None = None) -> web.StreamResponse:
    """A completion, a chat, or (``api``) Anthropic's Messages (and its count_tokens) or
    OpenAI's Responses: the chat path's generation and ``"mock"`` controls, in the API's wire
    (``backends.api_http``)."""
    stats = request.app[STATS_KEY]
    stats.start()
    outcome: Outcome = "completed"
    try:
        response, outcome = await _complete(request, stats, is_chat=is_chat, api=api)
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


async def _serve_api(request: web.Request, name: ChatApiName) -> web.StreamResponse:
    return await _serve_completion(request, is_chat=True, api=name)


async def _complete(
    request: web.Request, stats: MockStats, *, is_chat: bool, api: ChatApiName | None = None
) -> tuple[web.StreamResponse, Outcome]:
    stats.last_headers = request.headers
    stats.last_body = None
    call: ApiCall | None = None
    try:
        stats.last_body = orjson.loads(await request.read())
        if api is None:
            req = parse_request(stats.last_body, is_chat=is_chat, config=request.app[CONFIG_KEY])
        else:
            call = api_call(api, stats.last_body)
            req = parse_request(_chat_body(call), is_chat=True, config=request.app[CONFIG_KEY])
    except orjson.JSONDecodeError as exc:
        error = RequestError(400, f"The body is not valid JSON: {exc}")
        return _error_response(error, api), "completed"
    except RequestError as exc:
        return _error_response(exc, api), "completed"
    except ApiCallRefused as exc:
        return exc.response, "completed"

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
            return _error_response(error, api), "completed"
        if call is not None and call.is_count:
            return call.count_response(req.num_prompt_tokens), "completed"
        if req.is_stream:
            response, outcome = await _stream(request, req, call)
        else:
            response, outcome = await _respond_whole(request, req, call)
        if outcome == "completed":
            stats.record_success(req.model, req.finish_reason)
        return response, outcome
    finally:
        running[req.model] -= 1


def _chat_body(call: ApiCall) -> dict[str, Any]:
    """The chat request ``call`` renders to, with the client's ``"mock"`` controls."""
    body = call.chat_body()
    if "mock" in call.body:
        body["mock"] = call.body["mock"]
    return body


async def _respond_whole(
    request: web.Request, req: CompletionRequest, call: ApiCall | None
) -> tuple[web.StreamResponse, Outcome]:
    controls = req.controls
    if controls.die_after_chunks is not None:
        _abort(request)
        return web.Response(), "aborted"
    delay_ms = controls.first_token_delay_ms + req.max_tokens * controls.token_delay_ms
    if delay_ms > 0:
        await asyncio.sleep(delay_ms / 1000)
    body = (response_body(req, new_completion_id(req.is_chat), int(time.time())) if call is None
            else api_body(req, call.wire()))
    return web.Response(body=body, content_type=JSON_CONTENT_TYPE), "completed"


async def _stream(
    request: web.Request, req: CompletionRequest, call: ApiCall | None
) -> tuple[web.StreamResponse, Outcome]:
    die_after_chunks = req.controls.die_after_chunks
    response = web.StreamResponse(headers=SSE_HEADERS)
    plan = (stream_plan(req, new_completion_id(req.is_chat), int(time.time())) if call is None
            else api_stream_plan(req, call.wire()))
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
        if call is None:  # the Messages and Responses streams end with their plan's events
            await response.write(DONE_EVENT)
    except ConnectionResetError:  # the client went away between two writes
        return response, "cancelled"
    return response, "completed"


def _abort(request: web.Request) -> None:
    """Drop the connection with no further bytes, like a crashed engine."""
    if request.transport is not None:
        request.transport.abort()


def _error_response(error: RequestError, api: ChatApiName | None = None) -> web.Response:
    if api is not None:
        return api_error_response(api, error.status, error.message, error.param, error.code)
    body = orjson.dumps(error.body())
    return web.Response(status=error.status, body=body, content_type=JSON_CONTENT_TYPE)


def _models_body(models: tuple[str, ...], *, created_s: int) -> bytes:
    return orjson.dumps(models_page(models, created_s=created_s))


async def _models(request: web.Request) -> web.Response:
    return web.Response(body=request.app[MODELS_BODY_KEY], content_type=JSON_CONTENT_TYPE)


async def _health(request: web.Request) -> web.Response:
    return json_response(HEALTH_BODY)


async def _metrics(request: web.Request) -> web.Response:
    request.app[STATS_KEY].metrics_scrapes += 1
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
