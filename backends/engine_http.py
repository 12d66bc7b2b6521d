"""The HTTP surface every engine serves (the simulator, the PyTorch worker, the mock): vLLM's
OpenAI server, as the gateway and the official SDK see it.

The routes (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health``,
``/metrics``; Anthropic's ``/v1/messages`` and OpenAI's ``/v1/responses``, served as chat by
``backends.api_http``), OpenAI's error body, the completion and stream-chunk shapes, SSE
framing, and each request's OpenTelemetry SERVER span with engine_queue / prefill / decode
children. An engine supplies its handlers; the wire format is written here once.

Example::

    app = web.Application(client_max_size=MAX_REQUEST_BODY_BYTES)
    add_openai_routes(app, serve, models=_models, health=_health, metrics=_metrics)
    add_chat_api_routes(app, serve_api)  # /v1/messages, /v1/responses: see backends.api_http
    # in serve(request, is_chat): parse, run, then
    return web.Response(body=completion_body(parsed, new_completion_id(is_chat), text, usage,
                                             finish_reason="stop"),
                        content_type=JSON_CONTENT_TYPE)
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal, Protocol

import orjson
from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import extract
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import SpanKind, Tracer, set_span_in_context

from backends.embeddings import (
    EmbeddingsError,
    EmbeddingsRequest,
    dimensions_error,
    parse_embeddings,
)
from backends.engine_core.request import EngineRequestError
from backends.engine_core.tokenize import detokenize_body, tokenize_body
from backends.engine_core.types import EnginePhases
from backends.tokenizer import Tokenizer

MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024
JSON_CONTENT_TYPE = "application/json"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DONE_EVENT = b"data: [DONE]\n\n"
HEALTH_BODY = b'{"status":"ok"}'

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The APIs an engine serves by rendering them to chat, by name (``backends.api_http``).
ChatApiName = Literal["messages", "count_tokens", "responses"]
CHAT_API_PATHS: dict[ChatApiName, str] = {"messages": "/v1/messages",
                                          "count_tokens": "/v1/messages/count_tokens",
                                          "responses": "/v1/responses"}


class Completion(Protocol):
    """What the wire shapes need of a parsed request."""

    @property
    def is_chat(self) -> bool: ...

    @property
    def model(self) -> str: ...


def add_openai_routes(app: web.Application,
                      serve: Callable[[web.Request, bool], Awaitable[web.StreamResponse]], *,
                      models: Handler, health: Handler, metrics: Handler,
                      embeddings: Handler | None = None) -> None:
    """The routes every engine answers; ``serve(request, is_chat)`` handles both completion
    endpoints, ``embeddings`` (when given) ``/v1/embeddings``."""

    async def chat(request: web.Request) -> web.StreamResponse:
        return await serve(request, True)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await serve(request, False)

    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    if embeddings is not None:
        app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)


def add_chat_api_routes(
        app: web.Application,
        serve_api: Callable[[web.Request, ChatApiName], Awaitable[web.StreamResponse]]) -> None:
    """Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) and OpenAI's
    Responses API (``/v1/responses``); ``serve_api(request, name)`` serves each, rendered to
    chat (``backends.api_http.read_api_call``)."""

    def route(name: ChatApiName) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await serve_api(request, name)
        return handle

    for name, path in CHAT_API_PATHS.items():
        app.router.add_post(path, route(name))


TokenizerOf = Callable[[web.Request], tuple[tuple[str, ...], Tokenizer, int]]


def add_tokenizer_routes(app: web.Application, tokenizer_of: TokenizerOf) -> None:
    """vLLM's ``/tokenize`` and ``/detokenize`` (``backends.engine_core.tokenize``);
    ``tokenizer_of(request)`` gives the served models, the tokenizer and the context length."""

    async def tokenize(request: web.Request) -> web.StreamResponse:
        return await _tokenizer_answer(request, tokenizer_of, is_tokenize=True)

    async def detokenize(request: web.Request) -> web.StreamResponse:
        return await _tokenizer_answer(request, tokenizer_of, is_tokenize=False)

    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)


async def _tokenizer_answer(request: web.Request, tokenizer_of: TokenizerOf, *,
                            is_tokenize: bool) -> web.StreamResponse:
    try:
        body = await read_json(request)
    except BadBody as exc:
        return exc.response
    models, tokenizer, max_context_tokens = tokenizer_of(request)
    try:
        if is_tokenize:
            return json_response(tokenize_body(body, models=models, tokenizer=tokenizer,
                                               max_context_tokens=max_context_tokens))
        return json_response(detokenize_body(body, models=models, tokenizer=tokenizer))
    except EngineRequestError as exc:
        return error_response(exc.status, exc.message, exc.param, exc.code)


def error_type_for_status(status: int) -> str:
    """The OpenAI ``error.type`` that goes with an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 409:
        return "conflict"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object for ``status``."""
    return {"error": {"message": message, "type": error_type_for_status(status), "param": param,
                      "code": code}}


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(error_body(status, message, param, code)),
                        content_type=JSON_CONTENT_TYPE)


def json_response(body: Any) -> web.Response:
    """``body`` as JSON (bytes are sent as they are)."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return web.Response(body=data, content_type=JSON_CONTENT_TYPE)


class BadBody(Exception):
    """A request body the engine refuses (not JSON, by default); ``response`` is the error
    to send."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int = 400) -> None:
        super().__init__(message)
        self.response = error_response(status, message, param, code)


async def read_json(request: web.Request) -> Any:
    """The request's JSON body; raises ``BadBody`` (its 400) when it is not JSON."""
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise BadBody(f"The request body is not valid JSON: {exc}") from None


def check_embeddings(body: Any, models: tuple[str, ...], num_dims: int) -> EmbeddingsRequest:
    """The checked body (parsed JSON) of an embeddings request to an engine serving
    ``models`` with vectors of ``num_dims``; raises ``BadBody`` with its OpenAI-format error."""
    try:
        parsed = parse_embeddings(body, models)
        if (error := dimensions_error(parsed, num_dims)) is not None:
            raise error
    except EmbeddingsError as exc:
        raise BadBody(exc.message, exc.param, exc.code, exc.status) from None
    return parsed


def sequence_id(request: web.Request) -> str:
    """An engine's id for one sequence: the caller's request id (for logs and traces) made
    unique, since a client may send one id twice."""
    request_id = request.headers.get("x-request-id") or os.urandom(8).hex()
    return f"{request_id}-{os.urandom(4).hex()}"


def new_completion_id(is_chat: bool) -> str:
    return ("chatcmpl-" if is_chat else "cmpl-") + os.urandom(12).hex()


def completion_body(req: Completion, completion_id: str, text: str, usage: dict[str, Any], *,
                    created_s: int | None = None, **choice_fields: Any) -> bytes:
    """A whole (non-streamed) completion in OpenAI's shape; ``choice_fields`` (finish_reason,
    ...) follow ``logprobs`` in its choice."""
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text}} if req.is_chat
        else {"index": 0, "text": text}
    )
    choice |= {"logprobs": None, **choice_fields}
    return orjson.dumps({
        "id": completion_id,
        "object": "chat.completion" if req.is_chat else "text_completion",
        "created": int(time.time()) if created_s is None else created_s,
        "model": req.model,
        "choices": [choice],
        "usage": usage,
    })


def usage_body(num_prompt_tokens: int, num_output_tokens: int,
               num_cached_tokens: int) -> dict[str, Any]:
    """``usage`` as vLLM reports it, with ``prompt_tokens_details.cached_tokens``."""
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_output_tokens,
        "total_tokens": num_prompt_tokens + num_output_tokens,
        "prompt_tokens_details": {"cached_tokens": num_cached_tokens},
    }


def stream_head(req: Completion, completion_id: str, *,
                created_s: int | None = None) -> dict[str, Any]:
    """The fields every chunk of a stream starts with."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk" if req.is_chat else "text_completion",
        "created": int(time.time()) if created_s is None else created_s,
        "model": req.model,
    }


def sse_event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def models_page(models: Iterable[str], *, max_model_len: int | None = None,
                created_s: int = 0) -> dict[str, Any]:
    """``/v1/models``: the served models, with their context length when the engine has one."""
    length = {} if max_model_len is None else {"max_model_len": max_model_len}
    return {"object": "list", "data": [
        {"id": model, "object": "model", "created": created_s, "owned_by": "switchyard",
         "root": model, **length}
        for model in models]}


@functools.cache
def tracer(default_service: str) -> Tracer | None:
    """This process's tracer, from the standard ``OTEL_*`` variables (``default_service`` when
    no ``service.name`` is set); None when tracing is off (no ``OTEL_TRACES_EXPORTER`` and no
    OTLP endpoint, or ``none``)."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = env.get("OTEL_TRACES_EXPORTER") or (
        "otlp" if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") else "none")
    exporters: list[SpanExporter] = []
    for name in (n.strip().lower() for n in names.split(",") if n.strip()):
        if name == "otlp":
            exporters.append(OTLPSpanExporter())  # OTLP over HTTP, configured by OTEL_*
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name != "none":
            raise ValueError(f"OTEL_TRACES_EXPORTER={names!r}: unknown exporter {name!r}; use "
                             "otlp, console or none")
    if not exporters:
        return None
    service = OTELResourceDetector().detect().attributes.get("service.name") or default_service
    provider = TracerProvider(resource=Resource.create({"service.name": str(service)}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider.get_tracer(default_service.replace("-", "."))


def trace_request(spans: Tracer, request: web.Request, *, is_chat: bool, model: str,
                  max_tokens: int, phases: EnginePhases, finish_reason: str | None,
                  worker_id: str, started_ns: int) -> None:
    """The request's SERVER span and its engine_queue, prefill and decode children; the phases
    are in the event loop's clock, ``started_ns`` in the wall clock."""
    now_s = asyncio.get_running_loop().time()
    now_ns = time.time_ns()

    def to_ns(loop_s: float) -> int:
        # The loop's clock is read once per loop iteration: keep the phases inside the span.
        return max(started_ns, now_ns - round((now_s - loop_s) * 1e9))

    end_s = phases.finish_s if phases.finish_s is not None else now_s
    operation = "chat" if is_chat else "text_completion"
    parent = extract(request.headers) if "traceparent" in request.headers else None
    server = spans.start_span(
        f"{operation} {model}", context=parent, kind=SpanKind.SERVER,
        start_time=started_ns, attributes={
            "gen_ai.operation.name": operation, "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": max_tokens,
            "gen_ai.usage.input_tokens": phases.num_prompt_tokens,
            "gen_ai.usage.output_tokens": phases.num_output_tokens,
            "gen_ai.response.finish_reasons": [finish_reason or "abort"],
            "switchyard.worker.id": worker_id, "server.address": request.host.split(":")[0]})
    context = set_span_in_context(server)
    children: tuple[tuple[str, float | None, float | None, dict[str, int]], ...] = (
        ("engine_queue", phases.arrival_s, phases.scheduled_s, {}),
        ("prefill", phases.scheduled_s, phases.first_token_s, {
            "switchyard.engine.prompt_tokens": phases.num_prompt_tokens,
            "switchyard.engine.cached_tokens": phases.num_cached_tokens}),
        ("decode", phases.first_token_s, phases.finish_s, {
            "switchyard.engine.output_tokens": phases.num_output_tokens,
            "switchyard.engine.decode_steps": phases.num_decode_steps,
            "switchyard.engine.preemptions": phases.num_preemptions}),
    )
    for name, begin_s, stop_s, attributes in children:
        if begin_s is None:
            continue  # the client left before this phase began
        span = spans.start_span(name, context=context, start_time=to_ns(begin_s),
                                attributes=attributes)
        span.end(end_time=to_ns(stop_s if stop_s is not None else end_s))
    # Now, when the response has been written; the loop's timers may wake a little before
    # the modelled end of the last step.
    server.end(end_time=max(time.time_ns(), to_ns(end_s)))
