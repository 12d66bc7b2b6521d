"""Independent references for backends.tokenizer, written from scratch, and shared inputs.

The GGUF metadata comes from the struct-based reader (itself checked against the gguf package
in test_encoding.py); on top of it, GPT-2's byte-to-unicode table, a hand-written scanner for
the pre-tokenizer regex, and BPE that merges the lowest-ranked pair until none is left. Slow,
but plainly correct.
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from backends.tokenizer import default_model_path
from backends.tokenizer.gguf_metadata import read_gguf_metadata

ROOT = Path(__file__).resolve().parents[3]
USER = {"role": "user", "content": "Hi"}


# --- the reference: GGUF metadata by hand ------------------------------------------------------

# The struct reader is checked against the gguf package's GGUFReader in test_encoding.py
# (test_fast_metadata_reader_agrees_with_the_gguf_package), so the reference may use it.


@lru_cache(maxsize=1)
def gguf_metadata() -> dict[str, Any]:
    return read_gguf_metadata(default_model_path())


# --- the reference: byte-level BPE by hand -----------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable bytes map to themselves, the rest to chr(256 + n)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def is_letter(char: str) -> bool:
    return unicodedata.category(char).startswith("L")


def is_number(char: str) -> bool:
    return unicodedata.category(char).startswith("N")


def is_other(char: str) -> bool:
    return not (char.isspace() or is_letter(char) or is_number(char))


def gpt2_pieces(text: str) -> Iterator[str]:
    r"""The matches of GPT-2's pre-tokenizer regex, one alternative at a time::

        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    """
    start = 0
    while start < len(text):
        end = _gpt2_match_end(text, start)
        yield text[start:end]
        start = end


def _gpt2_match_end(text: str, start: int) -> int:
    for contraction in ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d"):
        if text.startswith(contraction, start):
            return start + len(contraction)
    for belongs in (is_letter, is_number, is_other):
        first = start + 1 if text[start] == " " and start + 1 < len(text) else start
        if not belongs(text[first]):
            first = start
        if belongs(text[first]):
            end = first
            while end < len(text) and belongs(text[end]):
                end += 1
            return end
    end = start
    while end < len(text) and text[end].isspace():
        end += 1
    if end == len(text) or end - 1 == start:  # \s+(?!\S) fails only by giving one space back
        return end
    return end - 1


@lru_cache(maxsize=1)
def reference_tables() -> tuple[dict[str, int], dict[tuple[str, ...], int], list[str]]:
    """Token → id, merge pair → rank, and the control tokens (type 3), from the raw metadata."""
    metadata = gguf_metadata()
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    ranks = {tuple(merge.split(" ")): rank
             for rank, merge in enumerate(metadata["tokenizer.ggml.merges"])}
    kinds = metadata["tokenizer.ggml.token_type"]
    specials = [token for token, kind in zip(tokens, kinds, strict=True) if kind == 3]
    return vocab, ranks, specials


def reference_encode(text: str) -> list[int]:
    vocab, ranks, specials = reference_tables()
    byte_chars = bytes_to_unicode()
    ids: list[int] = []
    position = 0
    while position < len(text):
        hits = [(text.find(s, position), -len(s), s) for s in specials if s in text[position:]]
        special_at, _, special = min(hits) if hits else (len(text), 0, "")
        segment = text[position:special_at]
        # Digits(individual_digits=True) first: every \p{N} character is a piece of its own.
        runs, run = [], ""
        for char in segment:
            if is_number(char):
                runs += [run, char] if run else [char]
                run = ""
            else:
                run += char
        runs += [run] if run else []
        for run in runs:
            for piece in gpt2_pieces(run):
                word = [byte_chars[byte] for byte in piece.encode("utf-8")]
                while len(word) > 1:
                    pairs = [(ranks.get((a, b), len(ranks)), i)
                             for i, (a, b) in enumerate(itertools.pairwise(word))]
                    rank, i = min(pairs)
                    if rank == len(ranks):
                        break
                    word[i : i + 2] = [word[i] + word[i + 1]]
                ids += [vocab[symbol] for symbol in word]
        if special:
            ids.append(vocab[special])
        position = special_at + len(special)
    return ids


REFERENCE_TEXTS = [
    pytest.param("Hello world", id="hello"),
    pytest.param("The quick brown fox jumps over the lazy dog.", id="sentence"),
    pytest.param("don't I'll we've they're she'd he's I'm", id="contractions"),
    pytest.param("DON'T SHOUT", id="uppercase-contraction"),
    pytest.param("  two leading spaces and trailing   ", id="spaces"),
    pytest.param("line one\nline two\n\n\tindented\r\nwindows", id="newlines-tabs"),
    pytest.param("Order 12345 costs $1,299.99 (20% off) on 2024-03-17", id="numbers"),
    pytest.param("x² + y³ = Ⅻ and ½", id="unicode-numbers"),
    pytest.param("héllo naïve café façade Ærøskøbing", id="accents"),
    pytest.param("東京は日本の首都です。", id="japanese"),
    pytest.param("Привет, мир! Γειά σου κόσμε", id="cyrillic-greek"),  # noqa: RUF001
    pytest.param("مرحبا بالعالم", id="arabic"),
    pytest.param("emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇫🇷", id="emoji"),
    pytest.param("def f(x):\n    return x**2  # square\n", id="python"),
    pytest.param('{"key": [1, 2, 3], "nested": {"a": null}}', id="json"),
    pytest.param("https://example.com/path?q=1&r=two#frag", id="url"),
    pytest.param("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", id="chatml"),
    pytest.param("a<|endoftext|>b<|im_end|><|im_start|>", id="adjacent-specials"),
    pytest.param("<repo_name>switchyard<file_sep>tokenizer.py", id="code-specials"),
    pytest.param("...!!!???---___", id="punctuation"),
    pytest.param("", id="empty"),
]
