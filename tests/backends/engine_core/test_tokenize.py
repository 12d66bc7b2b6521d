"""/tokenize and /detokenize bodies on the real SmolLM2 tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from backends.engine_core.request import EngineRequestError
from backends.engine_core.tokenize import detokenize_body, tokenize_body
from backends.tokenizer import ModelTokenizer, load_default_tokenizer

MODELS = ("m",)


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return load_default_tokenizer()


def test_a_prompt_and_a_chat_tokenize_as_the_engine_encodes_them(
        tokenizer: ModelTokenizer) -> None:
    answer = tokenize_body({"model": "m", "prompt": "Trains are fast."}, models=MODELS,
                           tokenizer=tokenizer, max_context_tokens=8192)
    assert answer["tokens"] == tokenizer.encode("Trains are fast.")
    assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] == 8192
    messages = [{"role": "user", "content": "hi"}]
    chat = tokenize_body({"messages": messages}, models=MODELS, tokenizer=tokenizer,
                         max_context_tokens=8192)
    assert chat["tokens"] == tokenizer.encode_chat(messages)
    without_turn = tokenize_body({"messages": messages, "add_generation_prompt": False},
                                 models=MODELS, tokenizer=tokenizer, max_context_tokens=8192)
    assert without_turn["count"] < chat["count"]
    back = detokenize_body({"model": "m", "tokens": answer["tokens"]}, models=MODELS,
                           tokenizer=tokenizer)
    assert back == {"prompt": "Trains are fast."}


@pytest.mark.parametrize(("body", "status", "param"), [
    pytest.param({"model": "other", "prompt": "x"}, 404, "model", id="unknown-model"),
    pytest.param({"model": "m"}, 400, "prompt", id="nothing-to-tokenize"),
    pytest.param({"model": "m", "messages": []}, 400, "messages", id="empty-chat"),
    pytest.param({"model": "m", "messages": [{"role": "user"}],
                  "add_generation_prompt": "yes"}, 400, "add_generation_prompt",
                 id="bad-flag"),
    pytest.param([1, 2], 400, None, id="not-an-object"),
])
def test_bad_tokenize_bodies(tokenizer: ModelTokenizer, body: Any, status: int,
                             param: str | None) -> None:
    with pytest.raises(EngineRequestError) as info:
        tokenize_body(body, models=MODELS, tokenizer=tokenizer, max_context_tokens=8192)
    assert (info.value.status, info.value.param) == (status, param)


@pytest.mark.parametrize(("tokens", "needle"), [
    pytest.param("abc", "array of token ids", id="not-a-list"),
    pytest.param([1, "2"], "array of token ids", id="not-ids"),
    pytest.param([1, 10**9], "'tokens'[1]", id="outside-the-vocabulary"),
])
def test_bad_detokenize_bodies(tokenizer: ModelTokenizer, tokens: Any, needle: str) -> None:
    with pytest.raises(EngineRequestError) as info:
        detokenize_body({"model": "m", "tokens": tokens}, models=MODELS, tokenizer=tokenizer)
    assert info.value.param == "tokens" and needle in info.value.message
