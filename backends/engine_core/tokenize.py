"""vLLM's ``/tokenize`` and ``/detokenize``, as the simulator and the PyTorch worker serve them.

``/tokenize`` takes ``prompt`` (text) or ``messages`` (a chat, rendered with the model's
template and, unless ``add_generation_prompt`` is false, the assistant's turn opened) and
answers ``{"count", "max_model_len", "tokens"}``; ``/detokenize`` takes ``tokens`` and answers
``{"prompt"}``. Errors are ``EngineRequestError`` with the field named.

Example::

    tokenize_body({"model": "m", "prompt": "hi"}, models=("m",), tokenizer=tok,
                  max_context_tokens=8192)   # {"count": 1, "max_model_len": 8192, "tokens": [...]}
"""

from __future__ import annotations

from typing import Any

from backends.engine_core.request import EngineRequestError
from backends.tokenizer import Tokenizer


def _checked_model(body: Any, models: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise EngineRequestError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and model not in models:  # vLLM lets it out: its one model is meant
        raise EngineRequestError(404, f"The model `{model}` does not exist.", "model",
                                 "model_not_found")
    return body


def tokenize_body(body: Any, *, models: tuple[str, ...], tokenizer: Tokenizer,
                  max_context_tokens: int) -> dict[str, Any]:
    """The answer to a ``/tokenize`` request."""
    body = _checked_model(body, models)
    messages = body.get("messages")
    prompt = body.get("prompt")
    if messages is not None:
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise EngineRequestError(400, "'messages' must be a non-empty array of objects with "
                                     "a string 'role'.", "messages")
        add_generation_prompt = body.get("add_generation_prompt", True)
        if not isinstance(add_generation_prompt, bool):
            raise EngineRequestError(400, "'add_generation_prompt' must be a boolean.",
                                     "add_generation_prompt")
        try:
            tokens = tokenizer.encode_chat(messages, add_generation_prompt=add_generation_prompt)
        except ValueError as exc:
            raise EngineRequestError(400, f"Cannot render the messages: {exc}",
                                     "messages") from None
    elif isinstance(prompt, str):
        tokens = tokenizer.encode(prompt)
    else:
        raise EngineRequestError(400, "Send 'prompt' (a string) or 'messages' (a chat).",
                                 "prompt")
    return {"count": len(tokens), "max_model_len": max_context_tokens, "tokens": tokens,
            "token_strs": None}


def detokenize_body(body: Any, *, models: tuple[str, ...], tokenizer: Tokenizer
                    ) -> dict[str, Any]:
    """The answer to a ``/detokenize`` request."""
    body = _checked_model(body, models)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise EngineRequestError(400, "'tokens' must be an array of token ids.", "tokens")
    vocab_size = tokenizer.vocab_size
    for index, token in enumerate(tokens):
        if not 0 <= token < vocab_size:
            raise EngineRequestError(
                400, f"'tokens'[{index}] is token id {token}, outside this model's vocabulary "
                f"(ids 0 to {vocab_size - 1}).", "tokens", "invalid_token_id")
    return {"prompt": tokenizer.decode(tokens)}
