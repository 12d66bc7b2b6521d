"""The HTTP surface of one simulated worker: the endpoints of a vLLM OpenAI server.

``/v1/chat/completions`` and ``/v1/completions`` (stream and not, ``usage`` with
``prompt_tokens_details.cached_tokens``), ``/v1/models``, ``/health``, and ``/metrics`` with
vLLM's metric names. Serve it with ``handler_cancellation=True`` so a client that goes away
aborts its sequence and frees its KV at once.

With tracing on (the standard ``OTEL_*`` variables, as for the gateway), each request adds a
SERVER span to the trace named by its ``traceparent``, with engine_queue, prefill and decode
spans timed by the worker's own clock.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from typing import Any

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

from backends.engine_core.request import (
    EngineRequest,
    EngineRequestError,
    parse_engine_request,
)
from backends.sim.core import SimEngineCore
from backends.sim.worker import RequestHandle, SimWorker
from backends.tokenizer import Tokenizer

WORKER = web.AppKey("sim_worker", SimWorker)
TOKENIZER = web.AppKey("sim_tokenizer", Tokenizer)
DONE_EVENT = b"data: [DONE]\n\n"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DEFAULT_MAX_TOKENS = 256
# Output "tokens" of the simulator: one word each, cycled. Only their count matters.
OUTPUT_WORDS = (" the", " of", " and", " to", " in", " is", " that", " it", " for", " as",
                " with", " was", " on", " be", " by", " this", " are", " from", " at", " or")


def output_text(index: int) -> str:
    return OUTPUT_WORDS[index % len(OUTPUT_WORDS)]


# Output words as they appear in a completion's "text" and a chat chunk's "delta".
_TEXT_WORDS_JSON = tuple(orjson.dumps(output_text(i)) for i in range(len(OUTPUT_WORDS)))
_CHAT_WORDS_JSON = tuple(orjson.dumps({"content": output_text(i)})
                         for i in range(len(OUTPUT_WORDS)))
_SLOT = "\x00"  # stands for the token's word in a stream's frame; JSON-escaped, it is unique
_SLOT_JSON = orjson.dumps(_SLOT)


def create_app(worker: SimWorker, tokenizer: Tokenizer) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[WORKER] = worker
    app[TOKENIZER] = tokenizer
    tracer()  # a bad OTEL_* setting fails at start, not on the first request
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/sim/profile", _profile)
    app.router.add_post("/reset_prefix_cache", _reset_prefix_cache)
    return app


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _serve(request, is_chat=True)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, is_chat=False)


def _error(status: int, message: str, param: str | None = None,
           code: str | None = None) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


async def _serve(request: web.Request, *, is_chat: bool) -> web.StreamResponse:
    worker = request.app[WORKER]
    started_ns = time.time_ns()
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return _error(400, f"The request body is not valid JSON: {exc}")
    try:
        parsed = parse_engine_request(
            body, is_chat=is_chat, models=(worker.profile.model,),
            tokenizer=request.app[TOKENIZER],
            max_context_tokens=worker.profile.max_context_tokens,
            default_max_tokens=DEFAULT_MAX_TOKENS,
        )
    except EngineRequestError as exc:
        return _error(exc.status, exc.message, exc.param, exc.code)
    request_id = request.headers.get("x-request-id") or os.urandom(8).hex()
    seq_id = f"{request_id}-{os.urandom(4).hex()}"
    try:
        handle = worker.submit(seq_id, parsed.prompt_ids, parsed.max_tokens, parsed.cache_salt)
    except ValueError as exc:
        return _error(400, str(exc), "messages" if is_chat else "prompt")
    completion_id = ("chatcmpl-" if is_chat else "cmpl-") + os.urandom(12).hex()
    try:
        if parsed.is_stream:
            return await _stream(request, parsed, handle, completion_id)
        await handle.wait_finished()
        return web.Response(body=_full_body(parsed, handle, completion_id),
                            content_type="application/json")
    finally:
        worker.abort(seq_id)  # no-op once finished; frees KV when the client went away
        if (spans := tracer()) is not None:
            _trace(spans, request, parsed, handle, worker.worker_id, started_ns)


def _usage(parsed: EngineRequest, handle: RequestHandle) -> dict[str, Any]:
    return {
        "prompt_tokens": handle.num_prompt_tokens,
        "completion_tokens": handle.num_output_tokens,
        "total_tokens": handle.num_prompt_tokens + handle.num_output_tokens,
        "prompt_tokens_details": {"cached_tokens": handle.num_cached_tokens},
    }


def _full_body(parsed: EngineRequest, handle: RequestHandle, completion_id: str) -> bytes:
    text = "".join(output_text(i) for i in range(handle.num_output_tokens))
    return completion_body(parsed, completion_id, text, _usage(parsed, handle),
                           finish_reason=handle.finish_reason)


def completion_body(parsed: EngineRequest, completion_id: str, text: str, usage: dict[str, Any],
                    **choice_fields: Any) -> bytes:
    """A whole (non-streamed) completion in OpenAI's shape; ``choice_fields`` (finish_reason,
    ...) follow ``logprobs`` in its choice. Shared with the PyTorch worker's server."""
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text}} if parsed.is_chat
        else {"index": 0, "text": text}
    )
    choice |= {"logprobs": None, **choice_fields}
    return orjson.dumps({
        "id": completion_id,
        "object": "chat.completion" if parsed.is_chat else "text_completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [choice],
        "usage": usage,
    })


def stream_head(parsed: EngineRequest, completion_id: str) -> dict[str, Any]:
    """The fields every chunk of a stream starts with. Shared with the PyTorch worker."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk" if parsed.is_chat else "text_completion",
        "created": int(time.time()),
        "model": parsed.model,
    }


async def _stream(request: web.Request, parsed: EngineRequest, handle: RequestHandle,
                  completion_id: str) -> web.StreamResponse:
    out = web.StreamResponse(headers=SSE_HEADERS)
    await out.prepare(request)
    head = stream_head(parsed, completion_id)
    usage_field = {"usage": None} if parsed.is_usage_streamed else {}

    def event(delta: Any, finish_reason: str | None) -> bytes:
        choice = {"index": 0, ("delta" if parsed.is_chat else "text"): delta,
                  "logprobs": None, "finish_reason": finish_reason}
        return b"data: " + orjson.dumps({**head, "choices": [choice], **usage_field}) + b"\n\n"

    # A token's event is this stream's constant frame around a pre-encoded word: every token
    # of every stream pays for it, so it is spliced, not serialised.
    token_prefix, token_suffix = event(_SLOT, None).split(_SLOT_JSON)
    words_json = _CHAT_WORDS_JSON if parsed.is_chat else _TEXT_WORDS_JSON
    is_finished = False
    while not is_finished:
        parts: list[bytes] = []
        for token in await handle.next_events():
            index = token.num_output_tokens - 1
            if parsed.is_chat and index == 0:
                parts.append(event({"role": "assistant", "content": ""}, None))
            parts += (token_prefix, words_json[index % len(words_json)], token_suffix)
            if token.finish_reason is not None:
                is_finished = True
                parts.append(event({} if parsed.is_chat else "", token.finish_reason))
                if parsed.is_usage_streamed:
                    tail: dict[str, Any] = {**head, "choices": [], "usage": _usage(parsed, handle)}
                    parts.append(b"data: " + orjson.dumps(tail) + b"\n\n")
                parts.append(DONE_EVENT)
        await out.write(b"".join(parts))  # tokens that piled up while behind go in one write
    await out.write_eof()
    return out


async def _models(request: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps(models_page(request.app[WORKER].core)),
                        content_type="application/json")


def models_page(core: SimEngineCore) -> dict[str, Any]:
    """``/v1/models``: the engine's one model and its context length."""
    return {"object": "list", "data": [{
        "id": core.profile.model, "object": "model", "created": 0, "owned_by": "switchyard",
        "max_model_len": core.profile.max_context_tokens}]}


async def _health(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def _profile(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    body = {"worker_id": worker.worker_id, "profile": worker.profile.to_json(),
            "load": worker.load(), "num_steps": worker.num_steps,
            "total_lateness_s": worker.total_lateness_s, "max_lateness_s": worker.max_lateness_s}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def _reset_prefix_cache(request: web.Request) -> web.Response:
    """vLLM's endpoint: forget every cached prefix, refused while requests hold KV."""
    if not request.app[WORKER].core.block_manager.reset_prefix_cache():
        body = orjson.dumps({"error": {
            "message": "Requests are holding KV blocks; retry when the engine is idle.",
            "type": "conflict", "param": None, "code": "busy"}})
        return web.Response(status=409, body=body, content_type="application/json")
    return web.Response(body=b'{"reset":true}', content_type="application/json")


async def _metrics(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    label = f'model_name="{worker.profile.model}"'
    lines = [
        *core_metrics_lines(worker.core),
        "# TYPE vllm:prompt_tokens counter",
        f"vllm:prompt_tokens_total{{{label}}} {worker.num_prompt_tokens_total}",
        "# TYPE vllm:generation_tokens counter",
        f"vllm:generation_tokens_total{{{label}}} {worker.num_generation_tokens_total}",
        "# TYPE vllm:request_success counter",
    ]
    for reason in ("stop", "length"):
        count = worker.num_requests_finished.get(reason, 0)
        lines.append(f'vllm:request_success_total{{{label},finished_reason="{reason}"}} {count}')
    body = ("\n".join(lines) + "\n").encode()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


def core_metrics_lines(core: SimEngineCore) -> list[str]:
    """The engine core's part of ``/metrics``, in vLLM's names: load, prefix cache, cache
    config (``bench/vsim/scrape.py`` serves these to the gateway's scrape in virtual time)."""
    load, profile = core.load(), core.profile
    label = f'model_name="{profile.model}"'
    return [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{label}}} {load.num_running}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{label}}} {load.num_waiting}",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{label}}} {load.kv_usage}",
        "# TYPE vllm:prefix_cache_queries counter",
        f"vllm:prefix_cache_queries_total{{{label}}} {load.prefix_cache_queries_tokens}",
        "# TYPE vllm:prefix_cache_hits counter",
        f"vllm:prefix_cache_hits_total{{{label}}} {load.prefix_cache_hits_tokens}",
        "# TYPE vllm:num_preemptions counter",
        f"vllm:num_preemptions_total{{{label}}} {load.num_preemptions}",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{profile.block_size}",'
        f'enable_prefix_caching="True",num_gpu_blocks="{profile.num_kv_blocks}"}} 1.0',
    ]



@functools.cache
def tracer() -> Tracer | None:
    """This process's tracer, from the standard ``OTEL_*`` variables; None when tracing is off
    (no ``OTEL_TRACES_EXPORTER`` and no OTLP endpoint, or ``none``)."""
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
    service = OTELResourceDetector().detect().attributes.get("service.name") or "switchyard-sim"
    provider = TracerProvider(resource=Resource.create({"service.name": str(service)}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider.get_tracer("switchyard.sim")


def _trace(spans: Tracer, request: web.Request, parsed: EngineRequest, handle: RequestHandle,
           worker_id: str, started_ns: int) -> None:
    """The request's SERVER span and its engine_queue, prefill and decode children."""
    phases = handle.phases()
    now_s = asyncio.get_running_loop().time()
    now_ns = time.time_ns()

    def to_ns(loop_s: float) -> int:
        # The loop's clock is read once per loop iteration: keep the phases inside the span.
        return max(started_ns, now_ns - round((now_s - loop_s) * 1e9))

    end_s = phases.finish_s if phases.finish_s is not None else now_s
    operation = "chat" if parsed.is_chat else "text_completion"
    parent = extract(request.headers) if "traceparent" in request.headers else None
    server = spans.start_span(
        f"{operation} {parsed.model}", context=parent, kind=SpanKind.SERVER,
        start_time=started_ns, attributes={
            "gen_ai.operation.name": operation, "gen_ai.request.model": parsed.model,
            "gen_ai.request.max_tokens": parsed.max_tokens,
            "gen_ai.usage.input_tokens": phases.num_prompt_tokens,
            "gen_ai.usage.output_tokens": phases.num_output_tokens,
            "gen_ai.response.finish_reasons": [handle.finish_reason or "abort"],
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
