"""The model's own tokenizer (`ModelTokenizer`), built from a GGUF file or a tokenizer.json.

A GGUF ``gpt2`` tokenizer becomes the `tokenizers.Tokenizer` Hugging Face ships for the model:
byte-level BPE with the GGUF's vocab and ranked merges, no prefix space, no normalizer, and the
control tokens (token type 3) added as special tokens so ``<|im_end|>`` in text is one id.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from backends.tokenizer.base import (
    ChatMessage,
    ChatTemplateError,
    TokenizerError,
    UnsupportedTokenizerError,
)
from backends.tokenizer.chat import ChatMLFormat
from backends.tokenizer.gguf_metadata import read_gguf_metadata

# llama.cpp's GGUF token types (llama_token_type).
_TOKEN_TYPE_UNKNOWN = 2
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

# tokenizer.ggml.pre → whether numbers are split into single digits before the GPT-2 regex.
# "smollm" and "starcoder" share llama.cpp's ("\p{N}", GPT-2 regex) pair; "gpt2" is the regex alone.
_PRE_TOKENIZER_SPLITS_DIGITS = {"smollm": True, "starcoder": True, "gpt2": False}


class ModelTokenizer:
    """A real model tokenizer (a `tokenizers.Tokenizer`) plus the model's chat format.

    Example::

        tokenizer = load_tokenizer_from_gguf(default_model_path())
        tokenizer.encode("Hello world")            # [19556, 905]
        tokenizer.decode([19556, 905])             # 'Hello world'
        tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    """

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        eos_token_id: int,
        bos_token_id: int | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.hf_tokenizer = tokenizer
        self.chat_template = chat_template
        self._eos_token_id = eos_token_id
        self._bos_token_id = bos_token_id
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._chat_format = ChatMLFormat.from_template(chat_template)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_id(self) -> int:
        return self._eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in the text become their single ids."""
        ids: list[int] = self.hf_tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self.hf_tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        text: str = self.hf_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text

    def token_to_id(self, token: str) -> int | None:
        token_id: int | None = self.hf_tokenizer.token_to_id(token)
        return token_id

    def render_chat(
        self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True
    ) -> str:
        if self._chat_format is None:
            raise ChatTemplateError(
                "this tokenizer's chat template is not ChatML and switchyard renders only "
                "ChatML; render the prompt yourself and call encode()"
            )
        return self._chat_format.render(messages, add_generation_prompt)

    def encode_chat(
        self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True
    ) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))


def load_tokenizer_from_gguf(path: str | os.PathLike[str]) -> ModelTokenizer:
    """The tokenizer in a GGUF file's metadata; the tensors are memory-mapped, never read."""
    metadata = _read_tokenizer_metadata(path)
    model = metadata.get("tokenizer.ggml.model")
    pre = metadata.get("tokenizer.ggml.pre", "gpt2")
    if model != "gpt2" or pre not in _PRE_TOKENIZER_SPLITS_DIGITS:
        raise UnsupportedTokenizerError(
            f"{path}: tokenizer model {model!r} with pre-tokenizer {pre!r} is not supported; "
            f"this loader builds byte-level BPE ('gpt2') with pre-tokenizer "
            f"{sorted(_PRE_TOKENIZER_SPLITS_DIGITS)}, or use load_tokenizer_from_json()"
        )
    adds = [
        key
        for key in ("add_bos_token", "add_space_prefix")
        if metadata.get(f"tokenizer.ggml.{key}")
    ]
    if adds:
        raise UnsupportedTokenizerError(
            f"{path}: {' and '.join(adds)} set; this loader builds tokenizers that add neither "
            "a BOS token nor a prefix space, so use load_tokenizer_from_json() instead"
        )
    eos_token_id = metadata.get("tokenizer.ggml.eos_token_id")
    if eos_token_id is None:
        raise TokenizerError(f"{path}: the GGUF metadata has no tokenizer.ggml.eos_token_id")
    tokenizer = build_byte_level_bpe(
        metadata["tokenizer.ggml.tokens"],
        metadata.get("tokenizer.ggml.merges", []),
        metadata.get("tokenizer.ggml.token_type", []),
        split_digits=_PRE_TOKENIZER_SPLITS_DIGITS[pre],
    )
    return ModelTokenizer(
        tokenizer,
        eos_token_id=int(eos_token_id),
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        chat_template=metadata.get("tokenizer.chat_template"),
    )


def build_byte_level_bpe(
    tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], *, split_digits: bool
) -> HFTokenizer:
    """Hugging Face's byte-level BPE tokenizer from llama.cpp's vocab, merges and token types."""
    bpe = models.BPE(
        vocab={token: token_id for token_id, token in enumerate(tokens)},
        merges=[_merge_pair(merge) for merge in merges],
        fuse_unk=False,
        byte_fallback=False,
    )
    tokenizer = HFTokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits
        else byte_level
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [
            AddedToken(tokens[i], special=True, normalized=False)
            for i, kind in enumerate(token_types)
            if kind in (_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_UNKNOWN)
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(tokens[i], special=False, normalized=False)
            for i, kind in enumerate(token_types)
            if kind == _TOKEN_TYPE_USER_DEFINED
        ]
    )
    return tokenizer


def load_tokenizer_from_json(
    path: str | os.PathLike[str],
    config_path: str | os.PathLike[str] | None = None,
    *,
    eos_token: str | None = None,
) -> ModelTokenizer:
    """A Hugging Face ``tokenizer.json``, with the chat template and special tokens from
    ``tokenizer_config.json`` (``config_path``, else the one beside ``path`` if present).

    ``eos_token`` overrides the config's; one of them must name the end-of-sequence token.
    """
    path = Path(path)
    tokenizer = HFTokenizer.from_file(str(path))
    config_file = Path(config_path) if config_path else path.with_name("tokenizer_config.json")
    config: dict[str, Any] = {}
    if config_path or config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
    eos_token = eos_token or _token_content(config.get("eos_token"))
    if eos_token is None:
        raise TokenizerError(
            f"{path}: no eos_token; pass eos_token= or provide a tokenizer_config.json naming it"
        )
    bos_token = _token_content(config.get("bos_token"))
    return ModelTokenizer(
        tokenizer,
        eos_token_id=_require_id(tokenizer, eos_token, path),
        bos_token_id=None if bos_token is None else _require_id(tokenizer, bos_token, path),
        chat_template=_chat_template(config, path),
    )


def _read_tokenizer_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``tokenizer.*`` keys of a GGUF file as Python values (see gguf_metadata)."""
    return read_gguf_metadata(path, prefix="tokenizer.")


def _merge_pair(merge: str) -> tuple[str, str]:
    # Byte-level tokens never hold a literal space (it is 'Ġ'), so the one space separates.
    left, _, right = merge.partition(" ")
    return left, right


def _token_content(token: object) -> str | None:
    if isinstance(token, dict):  # {"content": "<|im_end|>", "lstrip": false, ...}
        token = token.get("content")
    return token if isinstance(token, str) else None


def _require_id(tokenizer: HFTokenizer, token: str, path: Path) -> int:
    token_id: int | None = tokenizer.token_to_id(token)
    if token_id is None:
        raise TokenizerError(f"{path}: special token {token!r} is not in the vocabulary")
    return token_id


def _chat_template(config: dict[str, Any], path: Path) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default")
    if template is None:
        jinja_file = path.with_name("chat_template.jinja")
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
    return template if isinstance(template, str) else None
