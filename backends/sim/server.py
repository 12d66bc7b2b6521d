"""The HTTP surface of one simulated worker: the endpoints of a vLLM OpenAI server.

``/v1/chat/completions`` and ``/v1/completions`` (stream and not, ``usage`` with
``prompt_tokens_details.cached_tokens``), Anthropic's ``/v1/messages`` and OpenAI's
``/v1/responses`` (the same generation as chat, ``backends.api_http``), ``/v1/models``,
``/health``, and ``/metrics`` with vLLM's metric names. Serve it with
``handler_cancellation=True`` so a client that goes away aborts its sequence and frees its KV
at once.

With tracing on (the standard ``OTEL_*`` variables, as for the gateway), each request adds a
SERVER span to the trace named by its ``traceparent``, with engine_queue, prefill and decode
spans timed by the worker's own clock. With a request log (``--request-log``), each request
also gets a JSON line there (``phases_line``): where the engine's part of its TTFT went, joined
to the gateway's request log by the request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from typing import IO, Any

import orjson
from aiohttp import web

from backends.api_http import ApiCallRefused, TextDelta, read_api_call, stream_api, usage_of
from backends.embeddings import HASHED_DIMS, embeddings_body, hashed_embedding
from backends.engine_core.request import (
    EngineRequest,
    EngineRequestError,
    parse_engine_request,
)
from backends.engine_core.types import EnginePhases
from backends.engine_http import (
    DONE_EVENT,
    HEALTH_BODY,
    MAX_REQUEST_BODY_BYTES,
    METRICS_CONTENT_TYPE,
    SSE_HEADERS,
    BadBody,
    ChatApiName,
    add_chat_api_routes,
    add_openai_routes,
    add_tokenizer_routes,
    check_embeddings,
    completion_body,
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
from backends.sim.core import SimEngineCore
from backends.sim.worker import RequestHandle, SimWorker
from backends.tokenizer import Tokenizer

WORKER = web.AppKey("sim_worker", SimWorker)
TOKENIZER = web.AppKey("sim_tokenizer", Tokenizer)
REQUEST_LOG: web.AppKey[IO[str]] = web.AppKey("sim_request_log")
SERVICE_NAME = "switchyard-sim"  # the spans' service.name unless OTEL_SERVICE_NAME sets one
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


def create_app(worker: SimWorker, tokenizer: Tokenizer, request_log: IO[str] | None = None
               ) -> web.Application:
    app = web.Application(client_max_size=MAX_REQUEST_BODY_BYTES)
    app[WORKER] = worker
    app[TOKENIZER] = tokenizer
    if request_log is not None:
        app[REQUEST_LOG] = request_log
    tracer(SERVICE_NAME)  # a bad OTEL_* setting fails at start, not on the first request
    add_openai_routes(app, _serve, models=_models, health=_health, metrics=_metrics,
                      embeddings=_serve_embeddings)
    add_chat_api_routes(app, _serve_api)
    add_tokenizer_routes(app, lambda request: (
        (request.app[WORKER].profile.model,), request.app[TOKENIZER],
        request.app[WORKER].profile.max_context_tokens))
    app.router.add_get("/sim/profile", _profile)
    app.router.add_post("/reset_prefix_cache", _reset_prefix_cache)
    return app


async def _serve(request: web.Request, is_chat: bool) -> web.StreamResponse:
    started_ns = time.time_ns()
    try:
        body = await read_json(request)
    except BadBody as exc:
        return exc.response
    try:
        parsed = _parse(request, body, is_chat=is_chat)
    except EngineRequestError as exc:
        return error_response(exc.status, exc.message, exc.param, exc.code)
    completion_id = new_completion_id(is_chat)

    async def respond(handle: RequestHandle) -> web.StreamResponse:
        if parsed.is_stream:
            return await _stream(request, parsed, handle, completion_id)
        await handle.wait_finished()
        return json_response(_full_body(parsed, handle, completion_id))

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
    except EngineRequestError as exc:
        return call.error(exc.status, exc.message, exc.param, exc.code)
    if call.is_count:
        return call.count_response(len(parsed.prompt_ids))
    wire = call.wire()

    async def respond(handle: RequestHandle) -> web.StreamResponse:
        if parsed.is_stream:
            return await stream_api(request, wire, functools.partial(_text_deltas, handle),
                                    functools.partial(usage_of, handle))
        await handle.wait_finished()
        return json_response(wire.body(_output_text(handle), handle.finish_reason,
                                       usage_of(handle)))

    return await _run(request, parsed, started_ns, respond, call.error)


def _parse(request: web.Request, body: Any, *, is_chat: bool) -> EngineRequest:
    worker = request.app[WORKER]
    return parse_engine_request(
        body, is_chat=is_chat, models=(worker.profile.model,),
        tokenizer=request.app[TOKENIZER],
        max_context_tokens=worker.profile.max_context_tokens,
        default_max_tokens=DEFAULT_MAX_TOKENS,
    )


async def _run(request: web.Request, parsed: EngineRequest, started_ns: int,
               respond: Callable[[RequestHandle], Awaitable[web.StreamResponse]],
               error: Callable[[int, str, str | None], web.Response]) -> web.StreamResponse:
    """Submit ``parsed`` to the worker and ``respond`` as its tokens come; ``error`` writes a
    refusal in the request's API."""
    worker = request.app[WORKER]
    seq_id = sequence_id(request)
    try:
        handle = worker.submit(seq_id, parsed.prompt_ids, parsed.max_tokens, parsed.cache_salt)
    except ValueError as exc:
        return error(400, str(exc), "messages" if parsed.is_chat else "prompt")
    try:
        return await respond(handle)
    finally:
        worker.abort(seq_id)  # no-op once finished; frees KV when the client went away
        if (request_log := request.app.get(REQUEST_LOG)) is not None:
            line = phases_line(request.headers.get("x-request-id"), worker.worker_id,
                               handle.phases())
            with contextlib.suppress(OSError):  # a full disk must not fail the request
                request_log.write(line)
        if (spans := tracer(SERVICE_NAME)) is not None:
            trace_request(spans, request, is_chat=parsed.is_chat, model=parsed.model,
                          max_tokens=parsed.max_tokens, phases=handle.phases(),
                          finish_reason=handle.finish_reason, worker_id=worker.worker_id,
                          started_ns=started_ns)


def phases_line(request_id: str | None, worker_id: str, phases: EnginePhases) -> str:
    """A request's request-log line: ``request_id`` (the caller's, or null), ``worker``,
    ``prompt_tokens``, ``cached_tokens``, ``output_tokens``, ``preemptions``, and in seconds by
    the worker's clock ``arrival_s``, ``queue_s`` (to its first step), ``prefill_s`` (from
    then to its first token) and ``ttft_s`` (their sum); null for a phase never reached (the
    client left)."""
    arrival_s, scheduled_s, first_s = phases.arrival_s, phases.scheduled_s, phases.first_token_s
    return orjson.dumps({
        "request_id": request_id, "worker": worker_id, "arrival_s": round(arrival_s, 6),
        "queue_s": None if scheduled_s is None else round(scheduled_s - arrival_s, 6),
        "prefill_s": (None if scheduled_s is None or first_s is None
                      else round(first_s - scheduled_s, 6)),
        "ttft_s": None if first_s is None else round(first_s - arrival_s, 6),
        "prompt_tokens": phases.num_prompt_tokens, "cached_tokens": phases.num_cached_tokens,
        "output_tokens": phases.num_output_tokens, "preemptions": phases.num_preemptions,
    }).decode() + "\n"


async def _serve_embeddings(request: web.Request) -> web.StreamResponse:
    """Vectors derived from each input's text (``backends.embeddings.hashed_embedding``),
    answered after the time one prefill step of all the inputs' tokens takes on this
    worker's profile. They run beside the engine's batch, not in it: its load and KV cache
    do not see them."""
    worker = request.app[WORKER]
    tokenizer = request.app[TOKENIZER]
    try:
        parsed = check_embeddings(await read_json(request), (worker.profile.model,),
                                  HASHED_DIMS)
    except BadBody as exc:
        return exc.response
    num_tokens = sum(len(i) if isinstance(i, tuple) else len(tokenizer.encode(i))
                     for i in parsed.inputs)
    profile = worker.profile
    await asyncio.sleep(profile.latency.step_time_s(
        num_prefill_tokens=num_tokens, num_decode_seqs=0, num_kv_tokens=num_tokens,
        speed_factor=profile.speed_factor))
    vectors = [hashed_embedding(text, HASHED_DIMS) for text in parsed.texts]
    return json_response(embeddings_body(parsed, vectors, num_tokens))


def _usage(parsed: EngineRequest, handle: RequestHandle) -> dict[str, Any]:
    return usage_body(handle.num_prompt_tokens, handle.num_output_tokens,
                      handle.num_cached_tokens)


def _output_text(handle: RequestHandle) -> str:
    return "".join(output_text(i) for i in range(handle.num_output_tokens))


def _full_body(parsed: EngineRequest, handle: RequestHandle, completion_id: str) -> bytes:
    return completion_body(parsed, completion_id, _output_text(handle), _usage(parsed, handle),
                           finish_reason=handle.finish_reason)


async def _text_deltas(handle: RequestHandle) -> list[TextDelta]:
    return [TextDelta(output_text(token.num_output_tokens - 1), token.finish_reason)
            for token in await handle.next_events()]


async def _stream(request: web.Request, parsed: EngineRequest, handle: RequestHandle,
                  completion_id: str) -> web.StreamResponse:
    out = web.StreamResponse(headers=SSE_HEADERS)
    await out.prepare(request)
    head = stream_head(parsed, completion_id)
    usage_field = {"usage": None} if parsed.is_usage_streamed else {}

    def event(delta: Any, finish_reason: str | None) -> bytes:
        choice = {"index": 0, ("delta" if parsed.is_chat else "text"): delta,
                  "logprobs": None, "finish_reason": finish_reason}
        return sse_event({**head, "choices": [choice], **usage_field})

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
                    parts.append(sse_event(tail))
                parts.append(DONE_EVENT)
        await out.write(b"".join(parts))  # tokens that piled up while behind go in one write
    await out.write_eof()
    return out


async def _models(request: web.Request) -> web.Response:
    return json_response(sim_models_page(request.app[WORKER].core))


def sim_models_page(core: SimEngineCore) -> dict[str, Any]:
    """``/v1/models``: the engine's one model and its context length."""
    return models_page([core.profile.model], max_model_len=core.profile.max_context_tokens)


async def _health(request: web.Request) -> web.Response:
    request.app[WORKER].num_pages_served["/health"] += 1
    return json_response(HEALTH_BODY)


async def _profile(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    body = {"worker_id": worker.worker_id, "profile": worker.profile.to_json(),
            "load": worker.load(), "num_steps": worker.num_steps,
            "pages_served": worker.num_pages_served,
            "total_lateness_s": worker.total_lateness_s, "max_lateness_s": worker.max_lateness_s}
    return json_response(body)


async def _reset_prefix_cache(request: web.Request) -> web.Response:
    """vLLM's endpoint: forget every cached prefix, refused while requests hold KV."""
    if not request.app[WORKER].core.block_manager.reset_prefix_cache():
        return error_response(409, "Requests are holding KV blocks; retry when the engine is "
                              "idle.", code="busy")
    return json_response(b'{"reset":true}')


async def _metrics(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    worker.num_pages_served["/metrics"] += 1
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
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


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
