"""An engine that misbehaves on demand, for the fault tests: a real process on loopback.

``POST /fault {"mode": M}`` sets how it answers completions from then on; ``GET /fault``
says the mode and how many completion requests it has had. ``/health`` answers 200 in every
mode (the process is up: only what it does with requests is wrong). Modes:

- ``ok``: a correct OpenAI answer (a stream ends with ``data: [DONE]``);
- ``http_500``: 500 with an OpenAI error body;
- ``bad_sse``: a stream whose bytes are not server-sent events;
- ``bad_json``: 200 ``application/json`` that does not parse;
- ``truncated``: a ``Content-Length`` longer than the body, then the connection closes;
- ``no_done``: a stream that ends cleanly without ``data: [DONE]``;
- ``never_ending``: a stream that sends a token every 50 ms and never ends;
- ``hang``: reads the request and never answers.

Run: ``python -m tests.faulty_engine --port P --model M [--model M2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from aiohttp import web

MODES = ("ok", "http_500", "bad_sse", "bad_json", "truncated", "no_done", "never_ending",
         "hang")
STATE = web.AppKey("state", dict)


def _chunk(model: str, text: str, finish: str | None = None) -> bytes:
    event = {"id": "cmpl-faulty", "object": "chat.completion.chunk", "created": int(time.time()),
             "model": model, "choices": [{"index": 0, "delta": {"content": text},
                                          "finish_reason": finish}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    state["num_requests"] += 1
    body: dict[str, Any] = await request.json()
    model = str(body.get("model"))
    mode = state["mode"]
    is_stream = bool(body.get("stream"))
    max_tokens = int(body.get("max_tokens") or 4)
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "http_500":
        return web.json_response({"error": {"message": "engine fault", "type": "server_error",
                                            "param": None, "code": None}}, status=500)
    if mode == "bad_json":
        return web.Response(body=b'{"id": "cmpl", "choices": [', status=200,
                            content_type="application/json")
    if mode == "truncated":
        response = web.StreamResponse(status=200, headers={"Content-Length": "4096",
                                                           "Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"id": "cmpl", "choi')
        assert request.transport is not None
        request.transport.close()
        return response
    if not is_stream:
        return web.json_response({
            "id": "cmpl-faulty", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "finish_reason": "length",
                                         "message": {"role": "assistant",
                                                     "content": "x " * max_tokens}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": max_tokens,
                      "total_tokens": 3 + max_tokens}})
    response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if mode == "bad_sse":
        await response.write(b"<html>this is not an event stream</html>\n")
        await response.write_eof()
        return response
    if mode == "never_ending":
        while True:
            await response.write(_chunk(model, "x "))
            await asyncio.sleep(0.05)
    for index in range(max_tokens):
        await response.write(_chunk(model, "x ", "length" if index == max_tokens - 1 else None))
    if mode != "no_done":
        await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def set_fault(request: web.Request) -> web.Response:
    mode = (await request.json()).get("mode")
    if mode not in MODES:
        return web.json_response({"error": f"mode must be one of {MODES}"}, status=400)
    request.app[STATE]["mode"] = mode
    return web.json_response(request.app[STATE])


async def get_fault(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--mode", choices=MODES, default="ok")
    args = parser.parse_args()
    app = web.Application()
    app[STATE] = {"mode": args.mode, "num_requests": 0}
    models = {"object": "list", "data": [{"id": m, "object": "model"} for m in args.model]}
    app.router.add_get("/health", lambda _: web.Response(text="ok"))
    app.router.add_get("/v1/models", lambda _: web.json_response(models))
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/fault", set_fault)
    app.router.add_get("/fault", get_fault)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
