"""What an engine sends back for Anthropic Messages and OpenAI Responses requests.

Every engine generates the same way for ``/v1/chat/completions``, ``/v1/messages`` and
``/v1/responses`` (``backends.chat_apis`` renders the last two to chat); only the bytes on
the wire differ. A wire object writes them for one request: the events before the first
token (``start``), one per text delta (``delta``), the ones after the last token (``finish``,
the stream's end included), the whole body of a request that did not stream (``body``), and
an error event for a failure mid-stream. Usage is reported as each API does: Anthropic's
``input_tokens`` leave out the ``cache_read_input_tokens``; Responses' ``input_tokens`` hold
them, with ``input_tokens_details.cached_tokens``.

Example::

    wire = MessagesWire("m")
    out = wire.start(usage) + wire.delta(" Hello") + wire.finish("stop", usage)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                         403: "permission_error", 404: "not_found_error",
                         413: "request_too_large", 429: "rate_limit_error",
                         503: "overloaded_error", 529: "overloaded_error"}


@dataclass(frozen=True, slots=True)
class Usage:
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0


class ApiWire(Protocol):
    def start(self, usage: Usage) -> bytes: ...

    def delta(self, text: str) -> bytes: ...

    def finish(self, finish_reason: str | None, usage: Usage) -> bytes: ...

    def body(self, text: str, finish_reason: str | None, usage: Usage) -> bytes: ...

    def error_event(self, status: int, message: str) -> bytes: ...


def anthropic_error_type(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status."""
    return ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500
                                     else "invalid_request_error")


def anthropic_error(status: int, message: str, **extra: Any) -> dict[str, Any]:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``; ``extra``
    fields (an OpenAI-style ``code`` and ``param``) go in ``error`` too."""
    return {"type": "error",
            "error": {"type": anthropic_error_type(status), "message": message, **extra}}


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class MessagesWire:
    """Anthropic Messages: ``message_start``, a text block's start, deltas and stop, then
    ``message_delta`` (stop reason and usage) and ``message_stop``."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._id = "msg_" + os.urandom(12).hex()

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None,
                 usage: Usage) -> dict[str, Any]:
        return {"id": self._id, "type": "message", "role": "assistant", "model": self._model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": None,
                "usage": _anthropic_usage(usage)}

    def start(self, usage: Usage) -> bytes:
        return (_event("message_start", {"type": "message_start",
                                         "message": self._message([], None, usage)})
                + _event("content_block_start", {"type": "content_block_start", "index": 0,
                                                 "content_block": {"type": "text", "text": ""}}))

    def delta(self, text: str) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": text}})

    def finish(self, finish_reason: str | None, usage: Usage) -> bytes:
        return (_event("content_block_stop", {"type": "content_block_stop", "index": 0})
                + _event("message_delta", {
                    "type": "message_delta",
                    "delta": {"stop_reason": _stop_reason(finish_reason), "stop_sequence": None},
                    "usage": _anthropic_usage(usage)})
                + _event("message_stop", {"type": "message_stop"}))

    def body(self, text: str, finish_reason: str | None, usage: Usage) -> bytes:
        return orjson.dumps(self._message([{"type": "text", "text": text}],
                                          _stop_reason(finish_reason), usage))

    def error_event(self, status: int, message: str) -> bytes:
        return _event("error", anthropic_error(status, message))


def _stop_reason(finish_reason: str | None) -> str:
    return "max_tokens" if finish_reason == "length" else "end_turn"


def _anthropic_usage(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.num_prompt_tokens - usage.num_cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": usage.num_cached_tokens,
            "output_tokens": usage.num_output_tokens}


class ResponsesWire:
    """OpenAI Responses: ``response.created`` and ``response.in_progress``, an output message
    and its text part added, ``response.output_text.delta`` per delta, the text, part and item
    done, then ``response.completed`` (or ``response.incomplete`` at the token limit) with the
    whole response. ``request`` is the client's body: its settings are echoed."""

    def __init__(self, model: str, request: dict[str, Any]) -> None:
        self._model = model
        self._request = request
        self._id = "resp_" + os.urandom(12).hex()
        self._item_id = "msg_" + os.urandom(12).hex()
        self._created_s = int(time.time())
        self._num_events = 0
        self._texts: list[str] = []

    def _response(self, status: str, output: list[dict[str, Any]], usage: Usage | None,
                  finish_reason: str | None = None) -> dict[str, Any]:
        request = self._request
        incomplete = ({"reason": "max_output_tokens"} if status == "incomplete" else None)
        return {
            "id": self._id, "object": "response", "created_at": self._created_s,
            "status": status, "error": None, "incomplete_details": incomplete,
            "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"), "model": self._model,
            "output": output, "parallel_tool_calls": True,
            "previous_response_id": request.get("previous_response_id"),
            "temperature": request.get("temperature", 1.0),
            "top_p": request.get("top_p", 1.0), "tool_choice": "auto", "tools": [],
            "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "metadata": request.get("metadata") or {}, "store": False,
            "user": request.get("user"),
            "usage": None if usage is None else _responses_usage(usage),
        }

    def _message_item(self, status: str, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [_text_part(text)]
        return {"id": self._item_id, "type": "message", "status": status, "role": "assistant",
                "content": content}

    def _next(self, name: str, data: dict[str, Any]) -> bytes:
        data = {"type": name, "sequence_number": self._num_events, **data}
        self._num_events += 1
        return _event(name, data)

    def start(self, usage: Usage) -> bytes:
        in_progress = self._response("in_progress", [], None)
        part = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        return (self._next("response.created", {"response": in_progress})
                + self._next("response.in_progress", {"response": in_progress})
                + self._next("response.output_item.added", {
                    "output_index": 0, "item": self._message_item("in_progress", None)})
                + self._next("response.content_part.added", {**part, "part": _text_part("")}))

    def delta(self, text: str) -> bytes:
        self._texts.append(text)
        return self._next("response.output_text.delta", {
            "item_id": self._item_id, "output_index": 0, "content_index": 0, "delta": text,
            "logprobs": []})

    def finish(self, finish_reason: str | None, usage: Usage) -> bytes:
        text = "".join(self._texts)
        part = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        status = "incomplete" if finish_reason == "length" else "completed"
        item_status = "incomplete" if status == "incomplete" else "completed"
        return (self._next("response.output_text.done", {**part, "text": text, "logprobs": []})
                + self._next("response.content_part.done", {**part, "part": _text_part(text)})
                + self._next("response.output_item.done", {
                    "output_index": 0, "item": self._message_item(item_status, text)})
                + self._next(f"response.{status}", {"response": self._response(
                    status, [self._message_item(item_status, text)], usage)}))

    def body(self, text: str, finish_reason: str | None, usage: Usage) -> bytes:
        status = "incomplete" if finish_reason == "length" else "completed"
        item = self._message_item("incomplete" if status == "incomplete" else "completed", text)
        return orjson.dumps(self._response(status, [item], usage))

    def error_event(self, status: int, message: str) -> bytes:
        error = {"message": message, "type": "server_error" if status >= 500
                 else "invalid_request_error", "param": None, "code": None}
        return self._next("error", {"code": None, "message": message, "param": None,
                                    "error": error})


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _responses_usage(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.num_prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.num_cached_tokens},
            "output_tokens": usage.num_output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.num_prompt_tokens + usage.num_output_tokens}
