"""Request-body checks for the OpenAI endpoints: fast, hand-written, and explicit about the field.

Only the fields the gateway relies on or that an engine would reject anyway are checked; unknown
fields pass through untouched (the raw bytes are forwarded, never re-serialised).

Example::

    request = parse_completion_body(raw, route="chat")
    request.model, request.is_stream
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from backends.chat_apis import ApiRequestError, json_type, messages_to_chat, responses_to_chat
from backends.embeddings import EmbeddingsError, parse_embeddings
from gateway.errors import APIError

_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})

# field -> (kind, low, high); kinds: int, number, bool
_NUMERIC_FIELDS: dict[str, tuple[str, float | None, float | None]] = {
    "max_tokens": ("int", 1, None),
    "max_completion_tokens": ("int", 1, None),
    "n": ("int", 1, 128),
    "temperature": ("number", 0, 2),
    "top_p": ("number", 0, 1),
    "presence_penalty": ("number", -2, 2),
    "frequency_penalty": ("number", -2, 2),
    "seed": ("int", None, None),
    "top_k": ("int", -1, None),
}


@dataclass(slots=True, init=False)
class CompletionRequest:
    model: str
    is_stream: bool
    body: dict[str, Any]
    # A Messages or Responses body as the chat request it renders to: what routing reads
    # (``body`` is what the engine gets).
    chat_view: dict[str, Any] | None

    def __init__(self, model: str, is_stream: bool, body: dict[str, Any],
                 chat_view: dict[str, Any] | None = None) -> None:
        self.model = model
        self.is_stream = is_stream
        self.body = body
        self.chat_view = chat_view

    @property
    def routing_body(self) -> dict[str, Any]:
        return self.body if self.chat_view is None else self.chat_view


_MAIN_FIELD = {"chat": "messages", "completions": "prompt", "embeddings": "input",
               "tokenize": "prompt", "detokenize": "tokens", "messages": "messages",
               "count_tokens": "messages", "responses": "input"}


def _json_object(raw: bytes, route: str) -> dict[str, Any]:
    if not raw:
        raise APIError.bad_request(
            f"The request body is empty; send a JSON object with 'model' and "
            f"'{_MAIN_FIELD[route]}'.")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise APIError.bad_request(
            f"The request body is not valid JSON ({exc}). Send a JSON object.",
            code="invalid_json",
        ) from None
    if not isinstance(body, dict):
        raise APIError.bad_request(
            f"The request body must be a JSON object, not {json_type(body)}.", code="invalid_json"
        )
    return body


def parse_embeddings_body(raw: bytes) -> tuple[CompletionRequest, int]:
    """Parse and check an embeddings body; with the tokens its inputs hold (counted for
    token ids, estimated for text)."""
    body = _json_object(raw, "embeddings")
    try:
        parsed = parse_embeddings(body)
    except EmbeddingsError as exc:
        raise APIError.bad_request(exc.message, param=exc.param, code=exc.code) from None
    return (CompletionRequest(model=parsed.model, is_stream=False, body=body),
            parsed.num_estimated_tokens)


def parse_tokenizer_body(raw: bytes, *, route: str) -> CompletionRequest:
    """A ``/tokenize`` or ``/detokenize`` body: a JSON object naming its ``model`` (the
    gateway routes on it); the rest is the engine's to check."""
    body = _json_object(raw, route)
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise APIError.bad_request(
            "'model' must be a non-empty string of at most 256 characters: the gateway sends "
            "the request to an engine serving it.", param="model")
    return CompletionRequest(model=model, is_stream=False, body=body)


def parse_chat_api_body(raw: bytes, *, route: str) -> CompletionRequest:
    """Parse and check an Anthropic Messages (``route="messages"``, or ``"count_tokens"``)
    or OpenAI Responses (``"responses"``) body, with the chat request it renders to."""
    body = _json_object(raw, route)
    try:
        if route == "responses":
            view = responses_to_chat(body)
        else:
            view = messages_to_chat(body, is_count=route == "count_tokens")
    except ApiRequestError as exc:
        raise APIError.bad_request(exc.message, param=exc.param, code=exc.code) from None
    return CompletionRequest(model=view.model, is_stream=view.is_stream, body=body,
                             chat_view=view.chat_body())


def parse_completion_body(raw: bytes, *, route: str) -> CompletionRequest:
    """Parse and check a chat (``route="chat"``) or completions (``"completions"``) body."""
    body = _json_object(raw, route)
    model = body.get("model")
    if model is None:
        raise APIError.bad_request("Missing required parameter: 'model'.", param="model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise APIError.bad_request(
            "'model' must be a non-empty string of at most 256 characters.", param="model"
        )
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _type_error("stream", "a boolean", stream)
    if route == "chat":
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body)
    _check_stream_options(body.get("stream_options"))
    for name, (kind, low, high) in _NUMERIC_FIELDS.items():
        if name in body and body[name] is not None:
            _check_number(name, body[name], kind, low, high)
    if "stop" in body:
        _check_stop(body["stop"])
    if "user" in body and not isinstance(body["user"], str | None):
        raise _type_error("user", "a string", body["user"])
    if "cache_salt" in body and not isinstance(body["cache_salt"], str | None):
        raise _type_error("cache_salt", "a string", body["cache_salt"])
    return CompletionRequest(model=model, is_stream=stream, body=body)


def _type_error(param: str, expected: str, value: Any) -> APIError:
    return APIError.bad_request(
        f"Invalid type for '{param}': expected {expected}, but got {json_type(value)}.",
        param=param,
        code="invalid_type",
    )


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise APIError.bad_request("Missing required parameter: 'messages'.", param="messages")
    if not isinstance(messages, list):
        raise _type_error("messages", "an array of message objects", messages)
    if not messages:
        raise APIError.bad_request(
            "'messages' must contain at least one message.", param="messages"
        )
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _type_error(param, "an object", message)
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise APIError.bad_request(
                f"Invalid '{param}.role': {role!r}; expected one of {', '.join(sorted(_ROLES))}.",
                param=f"{param}.role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise _type_error(f"{param}.content", "a string or an array of parts", content)


def _check_prompt(body: dict[str, Any]) -> None:
    if "prompt" not in body or body["prompt"] is None:
        raise APIError.bad_request("Missing required parameter: 'prompt'.", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if all(isinstance(p, str) for p in prompt):
            return
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            _check_token_ids(prompt)
            return
        if isinstance(first, list) and all(
            isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
            for p in prompt
        ):
            for ids in prompt:
                _check_token_ids(ids)
            return
    raise _type_error(
        "prompt", "a string, an array of strings, or an array of token-id arrays", prompt
    )


MAX_TOKEN_ID = 2**32 - 1  # what any engine's vocabulary (and the prefix hashes) can hold


def _check_token_ids(ids: list[int]) -> None:
    for token in ids:
        if not 0 <= token <= MAX_TOKEN_ID:
            raise APIError.bad_request(
                f"Invalid token id in 'prompt': {token}; token ids are integers from 0 to "
                f"{MAX_TOKEN_ID} (and below the model's vocabulary size).", param="prompt",
                code="invalid_value")


def _check_stream_options(options: Any) -> None:
    if options is None:
        return
    if not isinstance(options, dict):
        raise _type_error("stream_options", "an object", options)
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise _type_error("stream_options.include_usage", "a boolean", include_usage)


def _check_number(name: str, value: Any, kind: str, low: float | None, high: float | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(name, "an integer" if kind == "int" else "a number", value)
    if kind == "int" and not isinstance(value, int):
        raise _type_error(name, "an integer", value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise APIError.bad_request(
            f"Invalid value for '{name}': {value}; it must be {bounds}.",
            param=name,
            code="invalid_value",
        )


def _check_stop(stop: Any) -> None:
    if stop is None or isinstance(stop, str):
        return
    if isinstance(stop, list) and len(stop) <= 16 and all(isinstance(s, str) for s in stop):
        return
    raise _type_error("stop", "a string or an array of up to 16 strings", stop)
