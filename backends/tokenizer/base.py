"""The tokenizer seam: the `Tokenizer` protocol, chat message types, and the errors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

ChatMessage = Mapping[str, Any]
"""An OpenAI chat message: ``{"role": ..., "content": str | list of parts | None}``."""


class TokenizerError(Exception):
    """A tokenizer cannot be loaded or cannot do what was asked; the message says what to change."""


class ModelFileMissingError(TokenizerError, FileNotFoundError):
    """The model file holding the tokenizer is not installed."""


class UnsupportedTokenizerError(TokenizerError, ValueError):
    """The model file describes a tokenizer this module does not build."""


class ChatTemplateError(TokenizerError, ValueError):
    """Messages cannot be rendered: unknown template, bad role or a non-text content part."""


class Tokenizer(Protocol):
    """What engines need from a tokenizer; `ModelTokenizer` and `ApproxTokenizer` provide it.

    Example::

        tokenizer = get_tokenizer("real")
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
        text = tokenizer.decode(output_ids, skip_special_tokens=True)
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int: ...

    @property
    def bos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

    def render_chat(
        self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True
    ) -> str: ...

    def encode_chat(
        self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True
    ) -> list[int]: ...
