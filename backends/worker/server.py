"""The HTTP surface of the PyTorch worker: the endpoints of a vLLM OpenAI server.

``/v1/chat/completions`` and ``/v1/completions`` (stream and not, ``usage`` with
``prompt_tokens_details.cached_tokens``), Anthropic's ``/v1/messages`` and OpenAI's
``/v1/responses`` (the same generation as chat, ``backends.api_http``), ``/v1/models``,
``/health``, ``/metrics`` with vLLM's names (`backends.worker.metrics`), ``/worker/profile``
and ``POST /reset_prefix_cache``. The wire format is every engine's (`backends.engine_http`):
the same errors, SSE framing and tracing spans (engine_queue, prefill, decode under the
caller's ``traceparent``).

Requests beyond the batch queue in the engine. Serve with ``handler_cancellation=True``
(`start_server` does): a client that goes away cancels its handler, which aborts the sequence
and frees its KV before the engine's next step.

Example::

    app = create_app(AsyncEngine(LLMEngine.from_path()), model_name="SmolLM2-135M-Instruct")
    runner = await start_server(app, "127.0.0.1", 8000)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from backends.api_http import (
    ApiCallRefused,
    TextDelta,
    engine_failure_message,
    read_api_call,
    stream_api,
    usage_of,
)
from backends.embeddings import embeddings_body
from backends.engine_http import (
    DONE_EVENT,
    HEALTH_BODY,
    MAX_REQUEST_BODY_BYTES,
    SSE_HEADERS,
    BadBody,
    ChatApiName,
    add_chat_api_routes,
    add_openai_routes,
    add_tokenizer_routes,
    check_embeddings,
    completion_body,
    error_body,
    error_response,
    json_response,
    models_page,
    new_completion_id,
    read_json,
    sequence_id,
    sse_event,
    stream_head,
    trace_request,
    tracer,
    usage_body,
)
from backends.publisher import KvPublisher
from backends.worker.async_engine import AsyncEngine, RequestHandle
from backends.worker.metrics import CONTENT_TYPE, WorkerMetrics
from backends.worker.request import RequestError, WorkerRequest, parse_request

SERVICE_NAME = "switchyard-worker"  # the spans' service.name unless OTEL_SERVICE_NAME sets one

@dataclass(slots=True)
class WorkerService:
    """What the handlers share: the engine, the model's name, the advertised profile."""

    engine: AsyncEngine
    model_name: str
    profile: Mapping[str, Any]
    publisher: KvPublisher | None = None
    metrics: WorkerMetrics = field(init=False)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.metrics = WorkerMetrics(self.model_name)

    @property
    def max_context_tokens(self) -> int:
        return self.engine.engine.scheduler.max_context_tokens

    async def leave_fleet(self) -> None:
        """Stop heartbeating and withdraw from Redis, so gateways stop sending work."""
        task = self.tasks.pop("publisher", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.publisher is not None:
            await self.publisher.withdraw()
            self.publisher = None


WORKER = web.AppKey("worker", WorkerService)


def create_app(engine: AsyncEngine, *, model_name: str,
               profile: Mapping[str, Any] | None = None) -> web.Application:
    """The worker's app; its cleanup context runs the engine loop and, when the engine has a
    publisher, the heartbeats to Redis."""
    app = web.Application(client_max_size=MAX_REQUEST_BODY_BYTES)
    app[WORKER] = WorkerService(engine, model_name, dict(profile or {}), engine.publisher)
    tracer(SERVICE_NAME)  # a bad OTEL_* setting fails at start, not on the first request
    app.cleanup_ctx.append(_run_engine)
    app.on_shutdown.append(_on_shutdown)
    add_openai_routes(app, _serve, models=_models, health=_health, metrics=_metrics,
                      embeddings=_serve_embeddings)
    add_chat_api_routes(app, _serve_api)
    add_tokenizer_routes(app, lambda request: (
        (request.app[WORKER].model_name,), request.app[WORKER].engine.engine.tokenizer,
        request.app[WORKER].max_context_tokens))
    app.router.add_get("/worker/profile", _profile)
    app.router.add_post("/reset_prefix_cache", _reset_prefix_cache)
    return app


async def start_server(app: web.Application, host: str, port: int, *,
                       shutdown_timeout_s: float = 10.0) -> web.AppRunner:
    """Listen on ``host:port``; ``await runner.cleanup()`` leaves the fleet, lets running
    requests finish (up to ``shutdown_timeout_s``), then stops the engine."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=shutdown_timeout_s)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner


async def _run_engine(app: web.Application) -> AsyncIterator[None]:
    worker = app[WORKER]
    engine = worker.engine
    worker.tasks["engine"] = asyncio.create_task(engine.run(), name=f"{engine.worker_id}-engine")
    if worker.publisher is not None:
        worker.tasks["publisher"] = asyncio.create_task(
            worker.publisher.run(engine.load, engine.resident_hashes),
            name=f"{engine.worker_id}-publisher")
    yield
    await worker.leave_fleet()
    for task in worker.tasks.values():
        task.cancel()
    for task in worker.tasks.values():
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _on_shutdown(app: web.Application) -> None:
    # Before the running requests are drained, so no gateway sends more meanwhile.
    await app[WORKER].leave_fleet()


async def _serve(request: web.Request, is_chat: bool) -> web.StreamResponse:
    started_ns = time.time_ns()
    try:
        body = await read_json(request)
    except BadBody as exc:
        return exc.response
    try:
        parsed = _parse(request, body, is_chat=is_chat)
    except RequestError as exc:
        return error_response(exc.status, exc.message, exc.param, exc.code)
    completion_id = new_completion_id(is_chat)

    async def respond(handle: RequestHandle) -> web.StreamResponse:
        if parsed.is_stream:
            return await _stream(request, parsed, handle, completion_id)
        try:
            _, text = await handle.wait_finished()
        except Exception as exc:
            return error_response(500, engine_failure_message(exc))
        return json_response(_full_body(parsed, handle, text, completion_id))

    return await _run(request, parsed, started_ns, respond, error_response)


async def _serve_api(request: web.Request, name: ChatApiName) -> web.StreamResponse:
    """Anthropic's Messages (and its count_tokens) or OpenAI's Responses, generated as the
    same conversation sent to chat (``backends.api_http``)."""
    started_ns = time.time_ns()
    try:
        call = await read_api_call(request, name)
    except ApiCallRefused as exc:
        return exc.response
    try:
        parsed = _parse(request, call.chat_body(), is_chat=True)
    except RequestError as exc:
        return call.error(exc.status, exc.message, exc.param, exc.code)
    if call.is_count:
        return call.count_response(len(parsed.prompt_ids))
    wire = call.wire()

    async def respond(handle: RequestHandle) -> web.StreamResponse:
        if parsed.is_stream:
            return await stream_api(request, wire, functools.partial(_text_deltas, handle),
                                    functools.partial(usage_of, handle))
        try:
            _, text = await handle.wait_finished()
        except Exception as exc:
            return call.error(500, engine_failure_message(exc))
        return json_response(wire.body(text, handle.finish_reason, usage_of(handle)))

    return await _run(request, parsed, started_ns, respond, call.error)


def _parse(request: web.Request, body: Any, *, is_chat: bool) -> WorkerRequest:
    worker = request.app[WORKER]
    return parse_request(body, is_chat=is_chat, models=(worker.model_name,),
                         tokenizer=worker.engine.engine.tokenizer,
                         max_context_tokens=worker.max_context_tokens)


async def _run(request: web.Request, parsed: WorkerRequest, started_ns: int,
               respond: Callable[[RequestHandle], Awaitable[web.StreamResponse]],
               error: Callable[[int, str, str | None], web.Response]) -> web.StreamResponse:
    """Submit ``parsed`` to the engine and ``respond`` as its outputs come; ``error`` writes a
    refusal in the request's API."""
    worker = request.app[WORKER]
    engine = worker.engine
    seq_id = sequence_id(request)
    try:
        handle = engine.submit(seq_id, parsed.prompt_ids, parsed.sampling, parsed.cache_salt)
    except ValueError as exc:
        return error(400, f"{exc}.", "messages" if parsed.is_chat else "prompt")
    try:
        return await respond(handle)
    finally:
        engine.abort(seq_id)  # no-op once finished; frees the KV when the client went away
        worker.metrics.observe(handle.phases())
        if (spans := tracer(SERVICE_NAME)) is not None:
            trace_request(spans, request, is_chat=parsed.is_chat, model=parsed.model,
                          max_tokens=parsed.max_tokens, phases=handle.phases(),
                          finish_reason=handle.finish_reason, worker_id=engine.worker_id,
                          started_ns=started_ns)


async def _serve_embeddings(request: web.Request) -> web.StreamResponse:
    """The model's last-token hidden states (``LLMEngine.embed``), one vector of its hidden
    size per input, computed between the engine's steps."""
    worker = request.app[WORKER]
    engine = worker.engine
    try:
        parsed = check_embeddings(await read_json(request), (worker.model_name,),
                                  engine.engine.model.config.hidden_size)
    except BadBody as exc:
        return exc.response
    tokenizer = engine.engine.tokenizer
    prompts = [list(i) if isinstance(i, tuple) else tokenizer.encode(i) for i in parsed.inputs]
    try:
        vectors = await engine.embed(prompts)
    except ValueError as exc:
        return error_response(400, f"{exc}.", "input", "invalid_value")
    return json_response(embeddings_body(parsed, vectors, sum(len(p) for p in prompts)))


def _usage(handle: RequestHandle) -> dict[str, Any]:
    return usage_body(handle.num_prompt_tokens, handle.num_output_tokens,
                      handle.num_cached_tokens)


async def _text_deltas(handle: RequestHandle) -> list[TextDelta]:
    return [TextDelta(output.text_delta, output.finish_reason)
            for output in await handle.next_outputs()]


def _full_body(parsed: WorkerRequest, handle: RequestHandle, text: str,
               completion_id: str) -> bytes:
    return completion_body(parsed, completion_id, text, _usage(handle),
                           finish_reason=handle.finish_reason, stop_reason=handle.stop_reason)


async def _stream(request: web.Request, parsed: WorkerRequest, handle: RequestHandle,
                  completion_id: str) -> web.StreamResponse:
    out = web.StreamResponse(headers=SSE_HEADERS)
    await out.prepare(request)
    head = stream_head(parsed, completion_id)
    usage_field = {"usage": None} if parsed.is_usage_streamed else {}

    def event(delta: Any, finish_reason: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, ("delta" if parsed.is_chat else "text"): delta,
                  "logprobs": None, "finish_reason": finish_reason, **extra}
        return sse_event({**head, "choices": [choice], **usage_field})

    is_finished = False
    while not is_finished:
        parts: list[bytes] = []
        try:
            outputs = await handle.next_outputs()
        except Exception as exc:
            error = error_body(500, engine_failure_message(exc))
            await out.write(sse_event(error) + DONE_EVENT)
            break
        for output in outputs:
            if parsed.is_chat and output.is_first:  # with the first token: it times TTFT
                parts.append(event({"role": "assistant", "content": ""}))
            if output.text_delta:
                parts.append(event({"content": output.text_delta} if parsed.is_chat
                                   else output.text_delta))
            if output.finish_reason is not None:
                is_finished = True
                parts.append(event({} if parsed.is_chat else "", output.finish_reason,
                                   stop_reason=output.stop_reason))
                if parsed.is_usage_streamed:
                    tail: dict[str, Any] = {**head, "choices": [], "usage": _usage(handle)}
                    parts.append(sse_event(tail))
                parts.append(DONE_EVENT)
        if parts:
            await out.write(b"".join(parts))  # outputs that piled up go in one write
    await out.write_eof()
    return out


async def _models(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    return json_response(models_page([worker.model_name],
                                     max_model_len=worker.max_context_tokens))


async def _health(request: web.Request) -> web.Response:
    task = request.app[WORKER].tasks.get("engine")
    if task is None or task.done():
        return error_response(503, "The engine loop is not running; restart the worker.")
    return json_response(HEALTH_BODY)


async def _metrics(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    return web.Response(body=worker.metrics.render(worker.engine),
                        headers={"Content-Type": CONTENT_TYPE})


async def _profile(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    engine = worker.engine
    body = {"worker_id": engine.worker_id, "profile": worker.profile, "load": engine.load(),
            "num_steps": engine.num_steps}
    return json_response(body)


async def _reset_prefix_cache(request: web.Request) -> web.Response:
    if not await request.app[WORKER].engine.reset_prefix_cache():
        return error_response(409, "Requests are holding KV blocks; retry when the worker is "
                              "idle.", code="busy")
    return json_response(b'{"reset":true}')
