"""The engines' side of Anthropic's Messages API and OpenAI's Responses API, served as chat.

An engine reads such a request with ``read_api_call``: its body checked by
``backends.chat_apis``, and refused when it holds content a text model cannot read or names a
stored response. The engine then runs its chat path's own checks on ``call.chat_body()``, so
the prompt, its tokens and its prefix-cache hits are those of the same conversation sent to
``/v1/chat/completions``, and answers through ``call.wire()`` (``backends.api_wire``):
``stream_api`` writes a stream, ``wire.body`` a whole response. A client of the Messages API
sees every error in Anthropic's shape; a Responses client gets OpenAI's, as chat's, with the
chat checks' field names turned into its own (``input``, ``max_output_tokens``).

Example::

    async def serve_api(request: web.Request, name: ChatApiName) -> web.StreamResponse:
        try:
            call = await read_api_call(request, name)
        except ApiCallRefused as exc:
            return exc.response
        try:
            parsed = parse_engine_request(call.chat_body(), is_chat=True, ...)
        except EngineRequestError as exc:
            return call.error(exc.status, exc.message, exc.param, exc.code)
        if call.is_count:
            return call.count_response(len(parsed.prompt_ids))
        handle = ...  # submitted as chat's
        return await stream_api(request, call.wire(), next_deltas, lambda: usage_of(handle))
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import orjson
from aiohttp import web

from backends.api_wire import ApiWire, MessagesWire, ResponsesWire, Usage, anthropic_error
from backends.chat_apis import ApiRequestError, ChatView, messages_to_chat, responses_to_chat
from backends.engine_http import (
    JSON_CONTENT_TYPE,
    SSE_HEADERS,
    ChatApiName,
    error_response,
    json_response,
)

# The chat checks name the chat request's fields; a Responses client sent these instead.
_RESPONSES_FIELDS = {"messages": "input", "max_tokens": "max_output_tokens"}
_CHAT_FIELD_RE = re.compile(r"\b(messages|max_tokens)\b")


class TextDelta(NamedTuple):
    """Text generated since the last delta; ``finish_reason`` is set on a generation's last."""

    text: str
    finish_reason: str | None = None


class TokenCounts(Protocol):
    """What a request handle (the simulator's, the worker's) counts."""

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def num_cached_tokens(self) -> int: ...


def engine_failure_message(exc: Exception) -> str:
    """What a client is told when the engine fails while generating its request."""
    return f"The engine failed while generating ({exc}); retry the request."


def usage_of(handle: TokenCounts) -> Usage:
    """A request's usage as far as it has generated: prompt, output and prefix-cache hits."""
    return Usage(handle.num_prompt_tokens, handle.num_output_tokens, handle.num_cached_tokens)


class ApiCallRefused(Exception):
    """A request refused before it reaches the engine; ``response`` is its error, in the
    API's shape."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def api_error_response(name: ChatApiName, status: int, message: str, param: str | None = None,
                       code: str | None = None) -> web.Response:
    """An error as ``name``'s clients read it: Anthropic's body on the Messages routes,
    OpenAI's on Responses (chat's ``messages`` and ``max_tokens`` renamed to its fields)."""
    if name == "responses":
        def rename(match: re.Match[str]) -> str:
            return _RESPONSES_FIELDS[match.group(1)]

        message = _CHAT_FIELD_RE.sub(rename, message)
        param = None if param is None else _CHAT_FIELD_RE.sub(rename, param)
        return error_response(status, message, param, code)
    body = anthropic_error(status, message, param=param, code=code)
    return web.Response(status=status, body=orjson.dumps(body), content_type=JSON_CONTENT_TYPE)


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One checked Messages, count_tokens or Responses request: the API, the client's body and
    the chat request it renders to.

    Example::

        call = api_call("messages", {"model": "m", "max_tokens": 8,
                                     "messages": [{"role": "user", "content": "Hi"}]})
        call.chat_body()  # {"model": "m", "messages": [...], "stream": False, "max_tokens": 8}
    """

    name: ChatApiName
    body: dict[str, Any]
    view: ChatView

    @property
    def is_count(self) -> bool:
        """A ``count_tokens`` request: answered with the prompt's tokens, nothing generated."""
        return self.name == "count_tokens"

    def chat_body(self) -> dict[str, Any]:
        """The ``/v1/chat/completions`` body to check and run as the chat path does."""
        return self.view.chat_body()

    def error(self, status: int, message: str, param: str | None = None,
              code: str | None = None) -> web.Response:
        return api_error_response(self.name, status, message, param, code)

    def wire(self) -> ApiWire:
        """A new writer of this request's response."""
        if self.name == "responses":
            return ResponsesWire(self.view.model, self.body)
        return MessagesWire(self.view.model)

    def count_response(self, num_prompt_tokens: int) -> web.Response:
        return json_response({"input_tokens": num_prompt_tokens})


def api_call(name: ChatApiName, body: Any) -> ApiCall:
    """``body`` (decoded JSON) checked as a request to ``name``; raises ``ApiCallRefused``."""
    try:
        view = (responses_to_chat(body) if name == "responses"
                else messages_to_chat(body, is_count=name == "count_tokens"))
    except ApiRequestError as exc:
        raise ApiCallRefused(api_error_response(name, exc.status, exc.message, exc.param,
                                                exc.code)) from None
    if view.non_text is not None:
        raise ApiCallRefused(api_error_response(
            name, 400, f"This engine reads text only: it cannot read the '{view.non_text}' "
            "content. Send text blocks only, or send the request to a model that reads "
            f"'{view.non_text}' content.", view.non_text, "unsupported_content"))
    if name == "responses":
        if body.get("previous_response_id") is not None:
            raise ApiCallRefused(api_error_response(
                name, 400, "This engine does not store responses, so it cannot continue one "
                "named by 'previous_response_id': send the whole conversation in 'input'.",
                "previous_response_id", "unsupported_value"))
        if not view.messages:
            raise ApiCallRefused(api_error_response(
                name, 400, "'input' holds no message to answer: send at least one message "
                "(or a string) in 'input'.", "input", "invalid_value"))
    return ApiCall(name, body, view)


async def read_api_json(request: web.Request, name: ChatApiName) -> Any:
    """The request's JSON body; raises ``ApiCallRefused`` (a 400 in the API's shape) when it is
    not JSON."""
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise ApiCallRefused(api_error_response(
            name, 400, f"The request body is not valid JSON: {exc}", code="invalid_json")
        ) from None


async def read_api_call(request: web.Request, name: ChatApiName) -> ApiCall:
    """The request's body checked as a request to ``name``; raises ``ApiCallRefused``."""
    return api_call(name, await read_api_json(request, name))


async def stream_api(request: web.Request, wire: ApiWire,
                     next_deltas: Callable[[], Awaitable[Sequence[TextDelta]]],
                     usage: Callable[[], Usage]) -> web.StreamResponse:
    """A generation streamed as ``wire``'s events: its start with the first deltas (as chat
    sends its role event with the first token: it times TTFT), an event per non-empty delta,
    and its finish, the stream's end, with the delta that has a finish reason. ``next_deltas()``
    waits for the deltas generated since its last call; if it raises (the engine failed), the
    stream ends with the API's error event."""
    out = web.StreamResponse(headers=SSE_HEADERS)
    await out.prepare(request)
    is_started = is_finished = False
    while not is_finished:
        try:
            deltas = await next_deltas()
        except Exception as exc:
            await out.write(wire.error_event(500, engine_failure_message(exc)))
            break
        parts = [] if is_started else [wire.start(usage())]
        is_started = True
        for text, finish_reason in deltas:
            if text:
                parts.append(wire.delta(text))
            if finish_reason is not None:
                parts.append(wire.finish(finish_reason, usage()))
                is_finished = True
        await out.write(b"".join(parts))  # deltas that piled up go in one write
    await out.write_eof()
    return out
