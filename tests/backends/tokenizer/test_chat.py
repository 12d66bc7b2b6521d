"""Chat rendering: ChatML output for both tokenizers, agreement with the GGUF's Jinja template,
rejected messages, and encode_chat."""

from __future__ import annotations

from typing import Any

import pytest

from backends.tokenizer import ApproxTokenizer, ChatTemplateError, ModelTokenizer
from tests.backends.tokenizer.reference import USER, gguf_metadata, reference_encode

DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)

SYSTEM = {"role": "system", "content": "Be brief."}
ASSISTANT = {"role": "assistant", "content": "Hello!"}

CHATS = [
    pytest.param([USER], True,
                 DEFAULT_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                 id="default-system-prompt"),
    pytest.param([SYSTEM, USER], True,
                 "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                 "<|im_start|>assistant\n", id="own-system-prompt"),
    pytest.param([USER, ASSISTANT, USER], False,
                 DEFAULT_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n"
                 "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
                 id="multi-turn-no-generation-prompt"),
    pytest.param([USER, SYSTEM], False,
                 DEFAULT_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n"
                 "<|im_start|>system\nBe brief.<|im_end|>\n", id="late-system-gets-default-too"),
    pytest.param([], True, "<|im_start|>assistant\n", id="no-messages"),
]


@pytest.mark.parametrize(("messages", "add_generation_prompt", "expected"), CHATS)
def test_render_chat(real: ModelTokenizer, messages: list[dict[str, Any]],
                     add_generation_prompt: bool, expected: str) -> None:
    assert real.render_chat(messages, add_generation_prompt) == expected
    assert ApproxTokenizer().render_chat(messages, add_generation_prompt) == expected


@pytest.mark.parametrize(("messages", "add_generation_prompt", "expected"), CHATS)
def test_render_chat_matches_jinja(real: ModelTokenizer, messages: list[dict[str, Any]],
                                   add_generation_prompt: bool, expected: str) -> None:
    jinja2_sandbox = pytest.importorskip("jinja2.sandbox")
    environment = jinja2_sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
                                                               lstrip_blocks=True)
    template = environment.from_string(gguf_metadata()["tokenizer.chat_template"])
    rendered = template.render(messages=messages, add_generation_prompt=add_generation_prompt)
    assert real.render_chat(messages, add_generation_prompt) == rendered == expected


def test_content_parts_are_joined_and_none_is_empty(real: ModelTokenizer) -> None:
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": parts},
                {"role": "assistant", "content": None}]
    assert real.render_chat(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nfirst\nsecond<|im_end|>\n"
        "<|im_start|>assistant\n<|im_end|>\n"
    )


@pytest.mark.parametrize("message", [
    pytest.param({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                 id="image-part"),
    pytest.param({"content": "no role"}, id="missing-role"),
    pytest.param({"role": "user", "content": 42}, id="number-content"),
])
def test_render_chat_rejects(real: ModelTokenizer, message: dict[str, Any]) -> None:
    with pytest.raises(ChatTemplateError):
        real.render_chat([message])


def test_encode_chat_uses_special_ids(real: ModelTokenizer) -> None:
    ids = real.encode_chat([SYSTEM, USER])
    assert ids == real.encode(real.render_chat([SYSTEM, USER])) == reference_encode(
        real.render_chat([SYSTEM, USER]))
    assert ids[0] == 1
    assert ids.count(1) == 3 and ids.count(2) == 2
