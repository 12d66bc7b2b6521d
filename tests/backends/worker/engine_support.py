"""A tiny engine for fast tests: the tiny random Llama and a character tokenizer for its vocab.

`CharTokenizer` is the `Tokenizer` seam's in-memory implementation: ids 0..3 are special
(``<pad>``, ``<s>``, ``</s>`` = EOS, ``<unk>``); every other id is one printable character.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.tokenizer import ChatMessage
from backends.worker.engine import EngineConfig, LLMEngine
from backends.worker.model import LlamaModel
from tests.backends.worker.checkpoints import TINY_CONFIG, tiny_model

EOS = 2
_SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")
_OFFSET = 28  # id 4 is " ", id 95 is "{"


class CharTokenizer:
    vocab_size = TINY_CONFIG.vocab_size
    eos_token_id = EOS
    bos_token_id = 1

    def encode(self, text: str) -> list[int]:
        return [ord(char) - _OFFSET for char in text]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return "".join(("" if skip_special_tokens else _SPECIAL[i]) if i < len(_SPECIAL)
                       else chr(i + _OFFSET) for i in ids)

    def render_chat(self, messages: Sequence[ChatMessage],
                    add_generation_prompt: bool = True) -> str:
        return "".join(str(message["content"]) for message in messages)

    def encode_chat(self, messages: Sequence[ChatMessage],
                    add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))


def prompt(seed: int, length: int) -> list[int]:
    """A deterministic prompt of ordinary (non-special) ids."""
    return [4 + (seed * 31 + index * 7 + index * index) % 90 for index in range(length)]


def make_engine(model: LlamaModel | None = None, **config: Any) -> LLMEngine:
    settings: dict[str, Any] = {"num_kv_blocks": 64, "block_size": 4, "max_batch": 8,
                                "max_num_batched_tokens": 64, "model_name": "tiny"}
    settings.update(config)
    return LLMEngine(model or tiny_model(), CharTokenizer(), EngineConfig(**settings))
