"""The HTTP surface of one simulated worker: the endpoints of a vLLM OpenAI server.

``/v1/chat/completions`` and ``/v1/completions`` (stream and not, ``usage`` with
``prompt_tokens_details.cached_tokens``), ``/v1/models``, ``/health``, and ``/metrics`` with
vLLM's metric names. Serve it with ``handler_cancellation=True`` so a client that goes away
aborts its sequence and frees its KV at once.
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson
from aiohttp import web

from backends.sim.request import SimRequest, SimRequestError, output_text, parse_sim_request
from backends.sim.worker import RequestHandle, SimWorker
from backends.tokenizer import Tokenizer

WORKER = web.AppKey("sim_worker", SimWorker)
TOKENIZER = web.AppKey("sim_tokenizer", Tokenizer)
DONE_EVENT = b"data: [DONE]\n\n"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DEFAULT_MAX_TOKENS = 256


def create_app(worker: SimWorker, tokenizer: Tokenizer) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[WORKER] = worker
    app[TOKENIZER] = tokenizer
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/sim/profile", _profile)
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
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return _error(400, f"The request body is not valid JSON: {exc}")
    try:
        parsed = parse_sim_request(
            body, is_chat=is_chat, models=(worker.profile.model,),
            tokenizer=request.app[TOKENIZER],
            max_context_tokens=worker.profile.max_context_tokens,
            default_max_tokens=DEFAULT_MAX_TOKENS,
        )
    except SimRequestError as exc:
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


def _usage(parsed: SimRequest, handle: RequestHandle) -> dict[str, Any]:
    return {
        "prompt_tokens": handle.num_prompt_tokens,
        "completion_tokens": handle.num_output_tokens,
        "total_tokens": handle.num_prompt_tokens + handle.num_output_tokens,
        "prompt_tokens_details": {"cached_tokens": handle.num_cached_tokens},
    }


def _full_body(parsed: SimRequest, handle: RequestHandle, completion_id: str) -> bytes:
    text = "".join(output_text(i) for i in range(handle.num_output_tokens))
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text}} if parsed.is_chat
        else {"index": 0, "text": text}
    )
    choice["logprobs"] = None
    choice["finish_reason"] = handle.finish_reason
    return orjson.dumps({
        "id": completion_id,
        "object": "chat.completion" if parsed.is_chat else "text_completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [choice],
        "usage": _usage(parsed, handle),
    })


async def _stream(request: web.Request, parsed: SimRequest, handle: RequestHandle,
                  completion_id: str) -> web.StreamResponse:
    out = web.StreamResponse(headers=SSE_HEADERS)
    await out.prepare(request)
    head = {
        "id": completion_id,
        "object": "chat.completion.chunk" if parsed.is_chat else "text_completion",
        "created": int(time.time()),
        "model": parsed.model,
    }
    usage_field = {"usage": None} if parsed.is_usage_streamed else {}

    def event(delta: Any, finish_reason: str | None) -> bytes:
        choice = {"index": 0, ("delta" if parsed.is_chat else "text"): delta,
                  "logprobs": None, "finish_reason": finish_reason}
        return b"data: " + orjson.dumps({**head, "choices": [choice], **usage_field}) + b"\n\n"

    async for token in handle.tokens():
        index = token.num_output_tokens - 1
        text = output_text(index)
        if parsed.is_chat:
            chunk = event({"content": text}, None)
            if index == 0:
                chunk = event({"role": "assistant", "content": ""}, None) + chunk
        else:
            chunk = event(text, None)
        if token.finish_reason is not None:
            chunk += event({} if parsed.is_chat else "", token.finish_reason)
            if parsed.is_usage_streamed:
                tail: dict[str, Any] = {**head, "choices": [], "usage": _usage(parsed, handle)}
                chunk += b"data: " + orjson.dumps(tail) + b"\n\n"
            chunk += DONE_EVENT
        await out.write(chunk)
    await out.write_eof()
    return out


async def _models(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    data = [{"id": worker.profile.model, "object": "model", "created": 0, "owned_by": "switchyard",
             "max_model_len": worker.profile.max_context_tokens}]
    return web.Response(body=orjson.dumps({"object": "list", "data": data}),
                        content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def _profile(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    body = {"worker_id": worker.worker_id, "profile": worker.profile.to_json(),
            "load": worker.load(), "num_steps": worker.num_steps,
            "total_lateness_s": worker.total_lateness_s}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def _metrics(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    load = worker.core.load()
    label = f'model_name="{worker.profile.model}"'
    lines = [
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

