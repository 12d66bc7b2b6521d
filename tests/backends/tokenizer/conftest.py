"""Shared fixture of the tokenizer tests: the real SmolLM2 tokenizer."""

from __future__ import annotations

import pytest

from backends.tokenizer import ModelTokenizer, load_default_tokenizer


@pytest.fixture(scope="module")
def real() -> ModelTokenizer:
    return load_default_tokenizer()
