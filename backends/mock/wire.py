"""OpenAI wire format: response bodies and SSE events for a `CompletionRequest`; the same
generation in the Messages or Responses wire (``backends.api_wire``).

Pure: builds bytes, does no I/O. One output word is one token.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from backends.api_wire import ApiWire, Usage
from backends.engine_http import completion_body, sse_event, stream_head, usage_body
from backends.mock.parse import CompletionRequest


def completion_text(req: CompletionRequest) -> str:
    return "".join(req.token(index) for index in range(req.max_tokens))


def usage(req: CompletionRequest) -> dict[str, Any]:
    return usage_body(req.num_prompt_tokens, req.max_tokens, 0)


def response_body(req: CompletionRequest, completion_id: str, created_s: int) -> bytes:
    """The whole non-streaming response, JSON-encoded."""
    return completion_body(req, completion_id, completion_text(req), usage(req),
                           created_s=created_s, finish_reason=req.finish_reason)


def stream_plan(
    req: CompletionRequest, completion_id: str, created_s: int
) -> Iterator[tuple[float, bytes]]:
    """``(delay_s, event)`` pairs of a streamed response, ``[DONE]`` excluded.

    The first-token delay comes before the first event that carries output (the
    role chunk for chat, as vLLM sends it once the first token exists); the token
    delay comes between tokens.
    """
    events = StreamEvents(req, completion_id, created_s)
    first_token_delay_s = req.controls.first_token_delay_ms / 1000
    token_delay_s = req.controls.token_delay_ms / 1000
    if req.is_chat:
        yield first_token_delay_s, events.role()
        first_token_delay_s = 0
    for index in range(req.max_tokens):
        yield (token_delay_s if index else first_token_delay_s), events.content(index)
    yield 0, events.finish()
    for event in events.usage_tail():
        yield 0, event


def api_usage(req: CompletionRequest) -> Usage:
    return Usage(req.num_prompt_tokens, req.max_tokens)


def api_body(req: CompletionRequest, wire: ApiWire) -> bytes:
    """The whole non-streaming response in ``wire``'s API."""
    return wire.body(completion_text(req), req.finish_reason, api_usage(req))


def api_stream_plan(req: CompletionRequest, wire: ApiWire) -> Iterator[tuple[float, bytes]]:
    """``(delay_s, event)`` pairs of a response streamed in ``wire``'s API, its end included.

    Paced as chat's `stream_plan`: the events before the first token stand in for chat's
    role chunk, after the first-token delay.
    """
    token_delay_s = req.controls.token_delay_ms / 1000
    yield req.controls.first_token_delay_ms / 1000, wire.start(Usage(req.num_prompt_tokens, 1))
    for index in range(req.max_tokens):
        yield (token_delay_s if index else 0), wire.delta(req.token(index))
    yield 0, wire.finish(req.finish_reason, api_usage(req))


class StreamEvents:
    """Builds the ``data: ...`` events of one streamed response, in order.

    Example::

        events = StreamEvents(req, "chatcmpl-1", 1700000000)
        head = [events.role()] if req.is_chat else []
        chunks = [events.content(i) for i in range(req.max_tokens)]
        tail = [events.finish(), *events.usage_tail(), DONE_EVENT]
    """

    def __init__(self, req: CompletionRequest, completion_id: str, created_s: int) -> None:
        self._req = req
        self._head = stream_head(req, completion_id, created_s=created_s)

    def role(self) -> bytes:
        return self._event({"role": "assistant", "content": ""}, None)

    def content(self, index: int) -> bytes:
        token = self._req.token(index)
        return self._event({"content": token} if self._req.is_chat else token, None)

    def finish(self) -> bytes:
        return self._event({} if self._req.is_chat else "", self._req.finish_reason)

    def usage_tail(self) -> list[bytes]:
        """The usage-only final chunk, when the client asked for it."""
        if not self._req.is_usage_streamed:
            return []
        return [sse_event({**self._head, "choices": [], "usage": usage(self._req)})]

    def _event(self, delta_or_text: dict[str, str] | str, finish_reason: str | None) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self._req.is_chat:
            choice["delta"] = delta_or_text
        else:
            choice["text"] = delta_or_text
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        chunk = {**self._head, "choices": [choice]}
        if self._req.is_usage_streamed:
            chunk["usage"] = None
        return sse_event(chunk)

