"""Validate an OpenAI completion request body into a `CompletionRequest` value.

Pure: no I/O. Anything the engine does not understand is ignored, as an
OpenAI server would; anything it needs and cannot use raises `RequestError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.mock.config import MockEngineConfig
from backends.mock.errors import RequestError

EMPTY_PROMPT_WORDS = ("ok",)


@dataclass(frozen=True, slots=True)
class MockControls:
    """Per-request test controls from the request's ``"mock"`` object."""

    first_token_delay_ms: float
    token_delay_ms: float
    hang_ms: float = 0
    status: int | None = None
    die_after_chunks: int | None = None


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """What to generate for one chat or text completion request."""

    is_chat: bool
    model: str
    output_words: tuple[str, ...]
    num_prompt_tokens: int
    max_tokens: int
    is_max_tokens_set: bool
    is_stream: bool
    is_usage_streamed: bool
    controls: MockControls

    @property
    def finish_reason(self) -> str:
        # Without a client limit the mock "stops on its own" after the default length.
        return "length" if self.is_max_tokens_set else "stop"

    def token(self, index: int) -> str:
        return " " + self.output_words[index % len(self.output_words)]


def parse_request(body: object, *, is_chat: bool, config: MockEngineConfig) -> CompletionRequest:
    """Validate ``body`` (already JSON-decoded) against what ``config`` serves."""
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "You must provide a 'model' (a non-empty string).", param="model")
    if model not in config.models:
        served = ", ".join(config.models)
        raise RequestError(
            404,
            f"The model '{model}' does not exist on this engine; it serves: {served}.",
            param="model",
            code="model_not_found",
        )
    if is_chat:
        words, num_prompt_tokens = _chat_prompt(body.get("messages"))
        limit = body.get("max_completion_tokens")
        limit_param = "max_completion_tokens"
        if limit is None:
            limit, limit_param = body.get("max_tokens"), "max_tokens"
    else:
        words, num_prompt_tokens = _text_prompt(body.get("prompt"))
        limit, limit_param = body.get("max_tokens"), "max_tokens"
    if limit is not None and (type(limit) is not int or limit < 1):
        raise RequestError(400, f"'{limit_param}' must be an integer >= 1.", param=limit_param)
    is_stream = body.get("stream")
    if is_stream is None:
        is_stream = False
    elif not isinstance(is_stream, bool):
        raise RequestError(400, "'stream' must be a boolean.", param="stream")
    stream_options = body.get("stream_options")
    return CompletionRequest(
        is_chat=is_chat,
        model=model,
        output_words=words or EMPTY_PROMPT_WORDS,
        num_prompt_tokens=num_prompt_tokens,
        max_tokens=config.default_max_tokens if limit is None else limit,
        is_max_tokens_set=limit is not None,
        is_stream=is_stream,
        is_usage_streamed=isinstance(stream_options, dict)
        and stream_options.get("include_usage") is True,
        controls=_controls(body.get("mock"), config),
    )


def _chat_prompt(messages: object) -> tuple[tuple[str, ...], int]:
    """Words of the last user message, and the word count of every message."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty array.", param="messages")
    num_words = 0
    last_user_words: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(
                400, "Each message must be an object with a string 'role'.", param="messages"
            )
        words = _content_text(message.get("content")).split()
        num_words += len(words)
        if message["role"] == "user":
            last_user_words = words
    return tuple(last_user_words), num_words


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only the text ones count
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _text_prompt(prompt: object) -> tuple[tuple[str, ...], int]:
    """Words of the prompt (its first element if a batch) and its token count."""
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str | list):
            prompt = first  # a batch: only the first prompt is answered
    if isinstance(prompt, str):
        words = prompt.split()
        return tuple(words), len(words)
    if isinstance(prompt, list) and all(type(token) is int for token in prompt):
        return tuple(str(token) for token in prompt), len(prompt)
    raise RequestError(
        400,
        "'prompt' must be a string, an array of strings, an array of token ids "
        "or an array of arrays of token ids.",
        param="prompt",
    )


def _controls(mock: object, config: MockEngineConfig) -> MockControls:
    if mock is None:
        return MockControls(config.first_token_delay_ms, config.token_delay_ms)
    if not isinstance(mock, dict):
        raise RequestError(400, "'mock' must be an object.", param="mock")
    status = _optional_int(mock, "status", minimum=400)
    if status is not None and status > 599:
        raise RequestError(
            400, "'mock.status' must be an HTTP error status (400-599).", param="mock"
        )
    return MockControls(
        first_token_delay_ms=_delay_ms(mock, "first_token_delay_ms", config.first_token_delay_ms),
        token_delay_ms=_delay_ms(mock, "token_delay_ms", config.token_delay_ms),
        hang_ms=_delay_ms(mock, "hang_ms", 0),
        status=status,
        die_after_chunks=_optional_int(mock, "die_after_chunks", minimum=0),
    )


def _delay_ms(mock: dict[str, Any], name: str, default_ms: float) -> float:
    value = mock.get(name)
    if value is None:
        return default_ms
    if type(value) not in (int, float) or value < 0:
        raise RequestError(400, f"'mock.{name}' must be a number >= 0.", param="mock")
    return float(value)


def _optional_int(mock: dict[str, Any], name: str, *, minimum: int) -> int | None:
    value = mock.get(name)
    if value is None:
        return None
    if type(value) is not int or value < minimum:
        raise RequestError(400, f"'mock.{name}' must be an integer >= {minimum}.", param="mock")
    return value
