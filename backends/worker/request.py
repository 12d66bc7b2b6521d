"""Parse and validate an OpenAI completion request for the PyTorch worker.

A `WorkerRequest` is the engines' common `EngineRequest` (model, prompt ids, max_tokens, stream
flags, cache salt) plus the `SamplingParams` a real model needs. Every problem raises a
`RequestError` carrying what the client sees: an HTTP status, a message that says what to
change, the offending ``param`` and, where OpenAI has one, a ``code``. Parameters this engine
does not implement (``n`` > 1, logprobs, penalties, tools ...) are refused, never ignored.

Example::

    parsed = parse_request(body, is_chat=True, models=("SmolLM2-135M-Instruct",),
                           tokenizer=tokenizer, max_context_tokens=8192)
    engine.submit(request_id, parsed.prompt_ids, parsed.sampling, parsed.cache_salt)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backends.engine_core.request import EngineRequest, EngineRequestError, checked_token_ids
from backends.tokenizer import ChatTemplateError, Tokenizer
from backends.worker.sampling import MAX_STOP_STRINGS, SamplingParams

DEFAULT_MAX_TOKENS = 256  # when the request sets none (capped by the room left in the context)
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


class RequestError(EngineRequestError):
    """A request the worker refuses: ``status``, ``message``, ``param``, ``code``."""


@dataclass(frozen=True, slots=True)
class WorkerRequest(EngineRequest):
    """A validated request: the simulator's fields plus how to sample."""

    sampling: SamplingParams


def _is_number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


def _is_int(value: object) -> bool:
    return type(value) is int


# name -> (is the value acceptable, what to write instead); None is always "not set".
_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (lambda v: _is_number(v) and 0 <= v <= 2,
                    "a number in [0, 2] (0 is greedy decoding)"),
    "top_p": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: _is_int(v) and v >= -1,
              "an integer >= 1, or 0 / -1 to keep every token"),
    "seed": (lambda v: _is_int(v) and SEED_RANGE[0] <= v <= SEED_RANGE[1],
             "an integer in [-2**63, 2**64 - 1]"),
    "stream": (lambda v: type(v) is bool, "true or false"),
    "stream_options": (lambda v: isinstance(v, dict), 'an object such as {"include_usage": true}'),
    "ignore_eos": (lambda v: type(v) is bool, "true or false"),
    "skip_special_tokens": (lambda v: type(v) is bool, "true or false"),
    "cache_salt": (lambda v: isinstance(v, str), "a string"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "stop_token_ids": (lambda v: isinstance(v, list) and all(_is_int(t) and t >= 0 for t in v),
                       "an array of non-negative token ids"),
}

# Accepted only at their neutral value: this engine does not implement them.
_UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: v == 1 and _is_int(v),
          "this worker returns one choice per request: send n separate requests"),
    "best_of": (lambda v: v == 1 and _is_int(v), "this worker does not support best_of; omit it"),
    "echo": (lambda v: v is False, "this worker does not echo the prompt; omit echo"),
    "suffix": (lambda v: False, "this worker does not support suffix (insertion); omit it"),
    "logprobs": (lambda v: v is False or v == 0,
                 "this worker does not return logprobs; omit logprobs"),
    "top_logprobs": (lambda v: v == 0, "this worker does not return logprobs; omit top_logprobs"),
    "logit_bias": (lambda v: v == {}, "this worker does not support logit_bias; omit it"),
    "presence_penalty": (lambda v: v == 0,
                         "this worker does not apply penalties; use 0 or omit it"),
    "frequency_penalty": (lambda v: v == 0,
                          "this worker does not apply penalties; use 0 or omit it"),
    "repetition_penalty": (lambda v: v == 1,
                           "this worker does not apply penalties; use 1 or omit it"),
    "tools": (lambda v: v == [], "this worker does not call tools; omit tools"),
    "functions": (lambda v: v == [], "this worker does not call functions; omit functions"),
    "response_format": (lambda v: v == {"type": "text"},
                        'this worker writes plain text only: omit response_format or use '
                        '{"type": "text"}'),
}


def parse_request(
    body: Any, *, is_chat: bool, models: tuple[str, ...], tokenizer: Tokenizer,
    max_context_tokens: int, default_max_tokens: int = DEFAULT_MAX_TOKENS,
) -> WorkerRequest:
    """Validate ``body`` (decoded JSON) for ``/v1/chat/completions`` (``is_chat``) or
    ``/v1/completions``; RequestError says what is wrong and what to send instead."""
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "You must provide a 'model' (a non-empty string).", "model")
    if model not in models:
        raise RequestError(404, f"The model `{model}` does not exist. This worker serves "
                           f"{', '.join(repr(m) for m in models)}.", "model", "model_not_found")
    for name, (is_ok, expected) in _CHECKS.items():
        value = body.get(name)
        if value is not None and not is_ok(value):
            raise RequestError(400, f"'{name}' must be {expected}; got {value!r}.", name)
    for name, (is_ok, advice) in _UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and not is_ok(value):
            raise RequestError(400, f"'{name}' = {value!r} is not supported: {advice}.", name)
    stop = _stop_strings(body.get("stop"))
    is_stream = body.get("stream") is True
    options = body.get("stream_options")
    if options is not None and not is_stream:
        raise RequestError(400, "'stream_options' is only allowed with \"stream\": true.",
                           "stream_options")
    include_usage = (options or {}).get("include_usage")
    if include_usage is not None and type(include_usage) is not bool:
        raise RequestError(400, "'stream_options.include_usage' must be true or false.",
                           "stream_options")
    prompt_ids = _chat_ids(body, tokenizer) if is_chat else _prompt_ids(body, tokenizer)
    max_tokens, is_max_tokens_set = _max_tokens(body, is_chat, len(prompt_ids),
                                                max_context_tokens, default_max_tokens)
    try:
        sampling = SamplingParams(
            temperature=_get(body, "temperature", 1.0), top_p=_get(body, "top_p", 1.0),
            top_k=_get(body, "top_k", 0), seed=body.get("seed"), max_tokens=max_tokens,
            stop=stop, stop_token_ids=tuple(_get(body, "stop_token_ids", ())),
            ignore_eos=_get(body, "ignore_eos", False),
            skip_special_tokens=_get(body, "skip_special_tokens", True))
    except ValueError as exc:  # the checks above should have caught it; say it anyway
        raise RequestError(400, f"Invalid sampling parameters: {exc}.") from None
    return WorkerRequest(
        is_chat=is_chat, model=model, prompt_ids=prompt_ids, max_tokens=max_tokens,
        is_max_tokens_set=is_max_tokens_set, is_stream=is_stream,
        is_usage_streamed=include_usage is True, cache_salt=body.get("cache_salt"),
        sampling=sampling)


def _get(body: dict[str, Any], name: str, default: Any) -> Any:
    value = body.get(name)
    return default if value is None else value


def _stop_strings(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    values = [stop] if isinstance(stop, str) else stop
    if (not isinstance(values, list) or len(values) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in values)):
        raise RequestError(400, f"'stop' must be a non-empty string or an array of at most "
                           f"{MAX_STOP_STRINGS} non-empty strings; got {stop!r}.", "stop")
    return tuple(values)


def _max_tokens(body: dict[str, Any], is_chat: bool, num_prompt_tokens: int,
                max_context_tokens: int, default_max_tokens: int) -> tuple[int, bool]:
    name = "max_completion_tokens" if is_chat and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    limit = body.get(name)
    if limit is not None and (not _is_int(limit) or limit < 1):
        raise RequestError(400, f"'{name}' must be an integer >= 1; got {limit!r}.", name)
    room = max_context_tokens - num_prompt_tokens
    max_tokens = limit if limit is not None else max(1, min(default_max_tokens, room))
    if num_prompt_tokens + max_tokens > max_context_tokens:
        what = "messages" if is_chat else "prompt"
        raise RequestError(
            400,
            f"This model's maximum context length is {max_context_tokens} tokens. However, you "
            f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the "
            f"{what}, {max_tokens} in the completion). Please reduce the length of the {what} "
            f"or set {name} to at most {max(room, 0)}.",
            what, "context_length_exceeded")
    return max_tokens, limit is not None


def _chat_ids(body: dict[str, Any], tokenizer: Tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty array of "
                           '{"role": ..., "content": ...} objects.', "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, f"messages[{index}] must be an object with a string "
                               "'role'.", "messages")
    try:
        return tokenizer.encode_chat(messages)
    except (ChatTemplateError, ValueError) as exc:
        raise RequestError(400, f"Cannot render the messages: {exc}.", "messages") from None


def _prompt_ids(body: dict[str, Any], tokenizer: Tokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        try:
            return checked_token_ids(prompt, tokenizer.vocab_size)
        except EngineRequestError as exc:
            raise RequestError(exc.status, exc.message, exc.param, exc.code) from None
    raise RequestError(
        400, "'prompt' must be a non-empty string or a non-empty array of token ids (this "
        "worker takes one prompt per request: send a batch as separate requests).", "prompt")
