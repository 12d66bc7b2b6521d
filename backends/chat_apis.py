"""Anthropic's Messages API and OpenAI's Responses API, read as the chat request they render to.

One reading for the gateway and the engines: the gateway checks a body, routes on its rendered
system + messages (so a conversation sent through either API shares its prefix blocks with the
same conversation sent to ``/v1/chat/completions``) and counts its ``max_tokens``; the simulated
engine, the PyTorch worker and the mock render the same messages with their chat template.

Text content is what a text model reads: Anthropic ``text`` blocks, ``tool_use`` blocks (their
JSON input), ``tool_result`` blocks (their text), Responses ``input_text`` / ``output_text``
parts, ``function_call`` and ``function_call_output`` items; thinking and reasoning are left
out. Any other block or item (an image, a document, a file, a kind this module does not know)
is kept out of the rendered text and named in ``ChatView.non_text``: an engine that reads text
only refuses it, the gateway passes it on (a multimodal engine reads it).

Example::

    view = messages_to_chat({"model": "m", "max_tokens": 64, "system": "Be brief.",
                             "messages": [{"role": "user", "content": "Hi"}]})
    view.messages  # [{"role": "system", ...}, {"role": "user", "content": "Hi"}]
    view.chat_body()  # what /v1/chat/completions would take
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

MAX_MODEL_CHARS = 256
_ANTHROPIC_ROLES = frozenset({"user", "assistant"})
_RESPONSES_ROLES = frozenset({"user", "assistant", "system", "developer"})
_TEXT_BLOCKS = frozenset({"text", "input_text", "output_text", "refusal"})
_SKIPPED_BLOCKS = frozenset({"thinking", "redacted_thinking", "reasoning"})


class ApiRequestError(Exception):
    """A body the API refuses: a 400 with the field the caller must change."""

    def __init__(self, message: str, param: str | None = None,
                 code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = 400
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class ChatView:
    """A Messages or Responses body as the chat request it renders to."""

    model: str
    messages: list[dict[str, str]]
    max_tokens: int | None
    is_stream: bool
    session: str | None = None  # metadata.user_id, prompt_cache_key or user: a routing key
    stop: tuple[str, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    non_text: str | None = None  # the first block a text-only engine cannot read, by type

    def chat_body(self) -> dict[str, Any]:
        """The ``/v1/chat/completions`` body this request renders to."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages,
                                "stream": self.is_stream}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.session is not None:
            body["user"] = self.session
        if self.stop:
            body["stop"] = list(self.stop)
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.top_p is not None:
            body["top_p"] = self.top_p
        return body


def messages_to_chat(body: Any, *, is_count: bool = False) -> ChatView:
    """Check an Anthropic Messages body (``is_count``: a ``count_tokens`` one, which has no
    ``max_tokens``) and read it as chat."""
    body = _object(body)
    model = _model(body)
    max_tokens = body.get("max_tokens")
    if not is_count or max_tokens is not None:
        if max_tokens is None:
            raise ApiRequestError("Missing required parameter: 'max_tokens' (the most tokens "
                                  "to generate; the Messages API requires it).", "max_tokens")
        _int_at_least("max_tokens", max_tokens, 1)
    messages: list[dict[str, str]] = []
    non_text: list[str] = []
    system = body.get("system")
    if system is not None:
        text = _blocks_text("system", system, non_text)
        if text:
            messages.append({"role": "system", "content": text})
    turns = body.get("messages")
    if turns is None:
        raise ApiRequestError("Missing required parameter: 'messages'.", "messages")
    if not isinstance(turns, list) or not turns:
        raise ApiRequestError("'messages' must be a non-empty array of {role, content} "
                              "objects.", "messages")
    for index, turn in enumerate(turns):
        param = f"messages[{index}]"
        if not isinstance(turn, dict):
            raise _type_error(param, "an object", turn)
        role = turn.get("role")
        if role not in _ANTHROPIC_ROLES:
            raise ApiRequestError(f"Invalid '{param}.role': {role!r}; expected 'user' or "
                                  "'assistant' (the system prompt goes in 'system').",
                                  f"{param}.role")
        if "content" not in turn:
            raise ApiRequestError(f"Missing required parameter: '{param}.content'.",
                                  f"{param}.content")
        messages.append({"role": role,
                         "content": _blocks_text(f"{param}.content", turn["content"], non_text)})
    stop = body.get("stop_sequences")
    if stop is not None and (not isinstance(stop, list)
                             or not all(isinstance(s, str) for s in stop)):
        raise _type_error("stop_sequences", "an array of strings", stop)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _type_error("metadata", "an object", metadata)
    user_id = metadata.get("user_id") if metadata else None
    if user_id is not None and not isinstance(user_id, str):
        raise _type_error("metadata.user_id", "a string", user_id)
    top_k = body.get("top_k")
    if top_k is not None:
        _int_at_least("top_k", top_k, 0)
    return ChatView(
        model=model, messages=messages, max_tokens=max_tokens, is_stream=_stream(body),
        session=user_id, stop=tuple(stop or ()),
        temperature=_number_in("temperature", body.get("temperature"), 0.0, 1.0),
        top_p=_number_in("top_p", body.get("top_p"), 0.0, 1.0),
        non_text=non_text[0] if non_text else None)


def responses_to_chat(body: Any) -> ChatView:
    """Check an OpenAI Responses body and read it as chat: ``instructions`` as the system
    message, then ``input`` (a string, or message, function-call and function-call-output
    items)."""
    body = _object(body)
    model = _model(body)
    messages: list[dict[str, str]] = []
    non_text: list[str] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _type_error("instructions", "a string", instructions)
        if instructions:
            messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if items is None:
        if body.get("previous_response_id") is None:
            raise ApiRequestError("Missing required parameter: 'input'.", "input")
    elif isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for index, item in enumerate(items):
            message = _responses_item(f"input[{index}]", item, non_text)
            if message is not None:
                messages.append(message)
    else:
        raise _type_error("input", "a string or an array of input items", items)
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None:
        _int_at_least("max_output_tokens", max_tokens, 1)
    session = None
    for name in ("prompt_cache_key", "safety_identifier", "user"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise _type_error(name, "a string", value)
        session = session or value
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise _type_error("previous_response_id", "a string", previous)
    return ChatView(
        model=model, messages=messages, max_tokens=max_tokens, is_stream=_stream(body),
        session=session,
        temperature=_number_in("temperature", body.get("temperature"), 0.0, 2.0),
        top_p=_number_in("top_p", body.get("top_p"), 0.0, 1.0),
        non_text=non_text[0] if non_text else None)


def _responses_item(param: str, item: Any, non_text: list[str]) -> dict[str, str] | None:
    if not isinstance(item, dict):
        raise _type_error(param, "an object", item)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in _RESPONSES_ROLES:
            raise ApiRequestError(
                f"Invalid '{param}.role': {role!r}; expected one of 'assistant', 'developer', "
                "'system', 'user'.", f"{param}.role")
        if "content" not in item:
            raise ApiRequestError(f"Missing required parameter: '{param}.content'.",
                                  f"{param}.content")
        role = "system" if role == "developer" else role
        return {"role": role, "content": _blocks_text(f"{param}.content", item["content"],
                                                      non_text)}
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise ApiRequestError(f"'{param}' is a function_call: it needs a string 'name' and "
                                  "string 'arguments'.", param)
        return {"role": "assistant", "content": f"{name}({arguments})"}
    if kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            output = _blocks_text(f"{param}.output", output, non_text)
        if not isinstance(output, str):
            raise _type_error(f"{param}.output", "a string", output)
        return {"role": "tool", "content": output}
    if not isinstance(kind, str):
        raise _type_error(f"{param}.type", "a string", kind)
    if kind not in _SKIPPED_BLOCKS:
        non_text.append(kind)
    return None


def _blocks_text(param: str, content: Any, non_text: list[str]) -> str:
    """The text of a string or an array of content blocks (either API's)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _type_error(param, "a string or an array of content blocks", content)
    parts: list[str] = []
    for index, block in enumerate(content):
        where = f"{param}[{index}]"
        if not isinstance(block, dict):
            raise _type_error(where, "a content block object", block)
        kind = block.get("type")
        if not isinstance(kind, str):
            raise ApiRequestError(f"'{where}' needs a string 'type' (for example 'text').",
                                  f"{where}.type")
        if kind in _TEXT_BLOCKS:
            field = "refusal" if kind == "refusal" else "text"
            text = block.get(field)
            if not isinstance(text, str):
                raise _type_error(f"{where}.{field}", "a string", text)
            parts.append(text)
        elif kind == "tool_use":
            parts.append(f"{block.get('name')}({orjson.dumps(block.get('input')).decode()})")
        elif kind == "tool_result":
            inner = block.get("content")
            if inner is not None:
                parts.append(_blocks_text(f"{where}.content", inner, non_text))
        elif kind not in _SKIPPED_BLOCKS:
            non_text.append(kind)
    return "\n".join(parts)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiRequestError(f"The request body must be a JSON object, not {json_type(body)}.",
                              code="invalid_json")
    return body


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        raise ApiRequestError("Missing required parameter: 'model'.", "model")
    if not isinstance(model, str) or not model or len(model) > MAX_MODEL_CHARS:
        raise ApiRequestError("'model' must be a non-empty string of at most "
                              f"{MAX_MODEL_CHARS} characters.", "model")
    return model


def _stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream")
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise _type_error("stream", "a boolean", stream)
    return stream


def _int_at_least(name: str, value: Any, low: int) -> None:
    if type(value) is not int:
        raise _type_error(name, "an integer", value)
    if value < low:
        raise ApiRequestError(f"Invalid value for '{name}': {value}; it must be >= {low}.",
                              name, "invalid_value")


def _number_in(name: str, value: Any, low: float, high: float) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float):
        raise _type_error(name, "a number", value)
    if not low <= value <= high:
        raise ApiRequestError(f"Invalid value for '{name}': {value}; it must be between {low:g} "
                              f"and {high:g}.", name, "invalid_value")
    return float(value)


def _type_error(param: str, expected: str, value: Any) -> ApiRequestError:
    return ApiRequestError(f"Invalid type for '{param}': expected {expected}, but got "
                           f"{json_type(value)}.", param, "invalid_type")


def json_type(value: Any) -> str:
    """How an error message names a JSON value's type: "null", "a string", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
