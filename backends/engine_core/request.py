"""Parse an OpenAI completion request for an engine (the simulated one and the PyTorch worker).

The prompt is tokenized with the model's tokenizer (chat messages rendered with its chat
template first), so token counts, context limits and prefix-cache hits behave like a real
engine's. Errors are the ones vLLM gives, in OpenAI's format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.tokenizer import Tokenizer


class EngineRequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class EngineRequest:
    is_chat: bool
    model: str
    prompt_ids: list[int]
    max_tokens: int
    is_max_tokens_set: bool
    is_stream: bool
    is_usage_streamed: bool
    cache_salt: str | None


_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0), "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0),
}


def parse_engine_request(
    body: Any, *, is_chat: bool, models: tuple[str, ...], tokenizer: Tokenizer,
    max_context_tokens: int, default_max_tokens: int,
) -> EngineRequest:
    if not isinstance(body, dict):
        raise EngineRequestError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise EngineRequestError(400, "You must provide a 'model' (a non-empty string).", "model")
    if model not in models:
        raise EngineRequestError(404, f"The model `{model}` does not exist.", "model",
                              "model_not_found")
    for name, (low, high) in _RANGES.items():
        value = body.get(name)
        if value is not None and (type(value) not in (int, float) or not low <= value <= high):
            raise EngineRequestError(400, f"{name} must be a number in [{low}, {high}], got "
                                  f"{value!r}.", name)
    n = body.get("n", 1)
    if n not in (None, 1):
        raise EngineRequestError(400, "The simulated engine supports only n=1.", "n")
    prompt_ids = _chat_ids(body, tokenizer) if is_chat else _prompt_ids(body, tokenizer)
    limit_name = "max_completion_tokens" if is_chat and "max_completion_tokens" in body \
        else "max_tokens"
    limit = body.get(limit_name)
    if limit is not None and (type(limit) is not int or limit < 1):
        raise EngineRequestError(400, f"{limit_name} must be an integer >= 1, got {limit!r}.",
                              limit_name)
    room = max_context_tokens - len(prompt_ids)
    max_tokens = limit if limit is not None else max(1, min(default_max_tokens, room))
    if len(prompt_ids) + max_tokens > max_context_tokens:
        raise EngineRequestError(
            400,
            f"This model's maximum context length is {max_context_tokens} tokens. However, you "
            f"requested {len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the "
            f"{'messages' if is_chat else 'prompt'}, {max_tokens} in the completion). Please "
            f"reduce the length of the {'messages' if is_chat else 'prompt'} or completion.",
            "messages" if is_chat else "prompt",
            "context_length_exceeded",
        )
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise EngineRequestError(400, "'stream' must be a boolean.", "stream")
    options = body.get("stream_options")
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise EngineRequestError(400, "'cache_salt' must be a string.", "cache_salt")
    return EngineRequest(
        is_chat=is_chat, model=model, prompt_ids=prompt_ids, max_tokens=max_tokens,
        is_max_tokens_set=limit is not None, is_stream=bool(stream),
        is_usage_streamed=isinstance(options, dict) and options.get("include_usage") is True,
        cache_salt=salt,
    )


def checked_token_ids(ids: list[int], vocab_size: int) -> list[int]:
    """A prompt given as token ids, each checked to be in the model's vocabulary."""
    for index, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise EngineRequestError(
                400, f"'prompt'[{index}] is token id {token}, outside this model's vocabulary "
                f"(ids 0 to {vocab_size - 1}).", "prompt", "invalid_token_id")
    return list(ids)


def _chat_ids(body: dict[str, Any], tokenizer: Tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise EngineRequestError(400, "'messages' must be a non-empty array.", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise EngineRequestError(400, f"messages[{index}] must be an object with a string "
                                  "'role'.", "messages")
    try:
        return tokenizer.encode_chat(messages)
    except ValueError as exc:
        raise EngineRequestError(400, f"Cannot render the messages: {exc}", "messages") from None


def _prompt_ids(body: dict[str, Any], tokenizer: Tokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return checked_token_ids(prompt, tokenizer.vocab_size)
    raise EngineRequestError(
        400, "'prompt' must be a string or an array of token ids (batches of prompts are not "
        "supported by the simulated engine).", "prompt",
    )
