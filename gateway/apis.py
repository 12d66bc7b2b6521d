"""The client APIs the proxy speaks, each with its own wire: OpenAI's (chat, completions,
embeddings, vLLM's tokenizer routes), Anthropic's Messages and OpenAI's Responses.

What differs between them is read here, once per route: the error body, how a complete
stream ends (``data: [DONE]``; ``message_stop``; ``response.completed`` or
``response.incomplete``), the error event a stream ends with when the gateway breaks it off,
and where the usage is (``completion_tokens``; ``output_tokens``, with Anthropic's
``input_tokens`` leaving out ``cache_read_input_tokens``). Everything else (auth, quotas,
SLO admission, routing, tracing) is the same for all.

Example::

    api = API_OF_ROUTE["messages"]
    api.error_body(404, "No such model.", "invalid_request_error", "model_not_found", "model")
    api.stream_is_complete(last_bytes)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from backends.api_wire import anthropic_error
from gateway.admit import output_tokens_from
from gateway.errors import error_body as openai_error_body
from gateway.router import reported_usage

_OUTPUT_TOKENS_RE = re.compile(rb'"output_tokens"\s*:\s*(\d+)')
_INPUT_TOKENS_RE = re.compile(rb'"input_tokens"\s*:\s*(\d+)')
_CACHE_READ_RE = re.compile(rb'"cache_read_input_tokens"\s*:\s*(\d+)')
_CACHE_CREATION_RE = re.compile(rb'"cache_creation_input_tokens"\s*:\s*(\d+)')
_CACHED_TOKENS_RE = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_DATA = b"data: "
HEAD_BYTES = 48  # longer than any end_heads prefix


class EventHeads:
    """The first ``HEAD_BYTES`` of a stream's latest event, followed chunk by chunk however
    the reads cut the events (``head``): what a Messages or Responses stream's end is judged
    on, since its last event may be far longer than a chunk (``response.completed`` holds the
    whole response). About half a microsecond per chunk: one ``rfind``, no per-marker scan."""

    __slots__ = ("_at_boundary", "_ended_newline", "head")

    def __init__(self) -> None:
        self.head = b""
        self._at_boundary = True  # the next chunk begins an event
        self._ended_newline = False

    def track(self, chunk: bytes) -> None:
        found = chunk.rfind(b"\n\n", 0, len(chunk) - 1)  # a boundary with an event after it
        if found >= 0:
            self.head = chunk[found + 2:found + 2 + HEAD_BYTES]
        elif self._at_boundary:
            self.head = chunk[:HEAD_BYTES]
        elif self._ended_newline and chunk[:1] == b"\n" and len(chunk) > 1:
            self.head = chunk[1:1 + HEAD_BYTES]  # "\n" | "\n...": cut between the two
        elif len(self.head) < HEAD_BYTES:  # the head itself was cut by the read
            self.head += chunk[:HEAD_BYTES - len(self.head)]
        self._at_boundary = chunk.endswith(b"\n\n") or (chunk == b"\n" and self._ended_newline)
        self._ended_newline = chunk.endswith(b"\n")


@dataclass(frozen=True, slots=True)
class Api:
    """One client API's wire, as the proxy needs it."""

    name: str  # "openai", "anthropic" or "responses"
    # A complete stream's last event begins with one of ``end_heads`` (its ``event:`` line,
    # or a data line whose type comes first) or, when its type comes last, ends near one of
    # ``end_tails`` (a quoted type: a JSON string cannot hold an unescaped quote, so text
    # that spells it does not match); ``end_name`` names it in errors.
    end_heads: tuple[bytes, ...]
    end_tails: tuple[bytes, ...]
    end_name: str
    # Events a stream sends before its first token, and after its last (its end included):
    # a stream without usage is counted one token per event between them.
    num_lead_events: int
    num_tail_events: int

    @property
    def is_openai(self) -> bool:
        return self.name == "openai"

    def error_body(self, status: int, message: str, type_: str, code: str | None = None,
                   param: str | None = None) -> bytes:
        """The API's error body for an error the gateway raises."""
        if self.name == "anthropic":
            return orjson.dumps(anthropic_error(status, message, code=code, param=param))
        return openai_error_body(message, type_, code, param)

    def is_error_body(self, body: bytes) -> bool:
        """Whether an engine's non-2xx body is an error in a shape clients of this API read
        (OpenAI's ``{"error": {...}}``, or Anthropic's ``{"type": "error", "error": {...}}``)."""
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return False
        return isinstance(data, dict) and isinstance(data.get("error"), dict)

    def client_error_body(self, status: int, body: bytes) -> bytes:
        """An engine's error body (``is_error_body``) in this API's shape: Anthropic clients
        get an OpenAI-shaped engine error converted; the rest go as they came."""
        if self.name != "anthropic":
            return body
        data = orjson.loads(body)
        if data.get("type") == "error":
            return body
        error = data["error"]
        message = error.get("message")
        extra = {k: error[k] for k in ("code", "param") if k in error}
        return orjson.dumps(anthropic_error(
            status, message if isinstance(message, str) else "The engine refused the request.",
            **extra))

    def stream_error(self, message: str, type_: str, code: str) -> bytes:
        """The event a stream the gateway breaks off ends with, one its clients raise on."""
        if self.name == "openai":
            return _DATA + openai_error_body(message, type_, code) + b"\n\n"
        if self.name == "anthropic":
            status = 503 if type_ == "service_unavailable" else 500
            data = orjson.dumps(anthropic_error(status, message, code=code))
        else:  # Responses: its error event, with the error object the OpenAI SDK raises on
            error = {"message": message, "type": type_, "param": None, "code": code}
            data = orjson.dumps({"type": "error", "code": code, "message": message,
                                 "param": None, "error": error})
        return b"event: error\n" + _DATA + data + b"\n\n"

    def is_stream_end(self, last_event_head: bytes, last_bytes: bytes) -> bool:
        """Whether a stream whose last event began with ``last_event_head``
        (``EventHeads.head``) and whose last bytes are ``last_bytes`` sent its end."""
        if last_event_head.startswith(self.end_heads):
            return True
        tail = last_bytes[-256:]
        return any(end in tail for end in self.end_tails)

    def output_tokens(self, tail: bytes, num_events: int) -> int:
        """The output tokens the usage at the end of a response says, else one per event
        between the lead and the tail ones."""
        if self.is_openai:
            return output_tokens_from(tail, num_events)
        found = _OUTPUT_TOKENS_RE.findall(tail)
        if found:
            return int(found[-1])  # the final count (Anthropic's message_start has an early 0)
        return max(0, num_events - self.num_lead_events - self.num_tail_events)

    def reported_usage(self, tail: bytes) -> tuple[int | None, int | None]:
        """(prompt tokens, cached tokens) as far as the usage at the end of a response (its
        last 4 KiB) says them; None for each it does not."""
        if self.is_openai:
            return reported_usage(tail)
        tail = tail[-4096:]
        inputs = _INPUT_TOKENS_RE.findall(tail)
        if self.name == "responses":
            cached = _CACHED_TOKENS_RE.findall(tail)
            return (int(inputs[-1]) if inputs else None, int(cached[-1]) if cached else None)
        reads = _CACHE_READ_RE.findall(tail)
        creations = _CACHE_CREATION_RE.findall(tail)
        num_read = int(reads[-1]) if reads else 0
        prompt = (int(inputs[-1]) + num_read + (int(creations[-1]) if creations else 0)
                  if inputs else None)
        return prompt, (num_read if reads else None)

    def cache_usage(self, tail: bytes) -> tuple[int, int] | None:
        """(prompt tokens, cached tokens) when the response said both, else None."""
        prompt, cached = self.reported_usage(tail)
        if prompt is None or cached is None:
            return None
        return prompt, cached


def _heads(*events: str) -> tuple[bytes, ...]:
    return tuple(head for event in events for head in (
        f"event: {event}\n".encode(), f"event: {event}\r\n".encode(),
        f'data: {{"type":"{event}"'.encode(), f'data: {{"type": "{event}"'.encode()))


def _tails(*events: str) -> tuple[bytes, ...]:
    return tuple(tail for event in events for tail in (
        f'"type":"{event}"'.encode(), f'"type": "{event}"'.encode()))


OPENAI = Api("openai", end_heads=(b"data: [DONE]",), end_tails=(b"data: [DONE]",),
             end_name="'data: [DONE]'", num_lead_events=1, num_tail_events=2)
ANTHROPIC = Api("anthropic", end_heads=_heads("message_stop"), end_tails=_tails("message_stop"),
                end_name="'message_stop'", num_lead_events=2, num_tail_events=3)
# response.failed ends a stream too: the engine said what failed, in the API's own words.
_RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")
RESPONSES = Api("responses", end_heads=_heads(*_RESPONSE_ENDS), end_tails=_tails(*_RESPONSE_ENDS),
                end_name="'response.completed'", num_lead_events=4, num_tail_events=4)
API_OF_ROUTE = {"chat": OPENAI, "completions": OPENAI, "embeddings": OPENAI,
                "tokenize": OPENAI, "detokenize": OPENAI, "messages": ANTHROPIC,
                "count_tokens": ANTHROPIC, "responses": RESPONSES}
