"""Incremental detokenization: whole characters only, stop strings cut and held back."""

from __future__ import annotations

import pytest

from backends.tokenizer import load_default_tokenizer
from backends.worker.detokenizer import IncrementalDetokenizer
from tests.backends.worker.engine_support import CharTokenizer

TOKENIZER = CharTokenizer()


def _stream(text: str, stop: tuple[str, ...]) -> tuple[list[str], str, str | None]:
    """Feed ``text`` one character-token at a time; the deltas taken while streaming, the
    final flush and the stop string that ended it."""
    detok = IncrementalDetokenizer(TOKENIZER, stop=stop)
    deltas = []
    for token_id in TOKENIZER.encode(text):
        if detok.add_token(token_id):
            break
        deltas.append(detok.take_delta(is_finished=False))
    return deltas, detok.take_delta(is_finished=True), detok.stop_reason


@pytest.mark.parametrize(
    ("text", "stop", "output", "stop_reason"),
    [
        pytest.param("hello world", (), "hello world", None, id="no-stop"),
        pytest.param("hello world", ("o w",), "hell", "o w", id="cut-before-stop"),
        pytest.param("abcSTOPdef", ("STOP", "cS"), "ab", "cS", id="earliest-stop-wins"),
        pytest.param("ababX", ("abX",), "ab", "abX", id="overlapping-prefix"),
        pytest.param("aSTOP", ("STOP",), "a", "STOP", id="stop-at-end"),
        pytest.param("STOPa", ("STOP",), "", "STOP", id="stop-at-start"),
        pytest.param("hello STO", ("STOP",), "hello STO", None, id="partial-stop-flushed"),
    ],
)
def test_stop_strings(text: str, stop: tuple[str, ...], output: str,
                      stop_reason: str | None) -> None:
    deltas, flushed, reason = _stream(text, stop)
    assert "".join(deltas) + flushed == output
    assert reason == stop_reason


def test_streaming_holds_back_what_may_start_a_stop_string() -> None:
    deltas, flushed, _ = _stream("abcdef", ("xyz",))
    assert deltas == ["", "", "a", "b", "c", "d"]
    assert flushed == "ef"


def test_special_tokens_are_skipped_or_shown() -> None:
    for skip, expected in ((True, "ab"), (False, "a</s>b")):
        detok = IncrementalDetokenizer(TOKENIZER, skip_special_tokens=skip)
        for token_id in [*TOKENIZER.encode("a"), 2, *TOKENIZER.encode("b")]:
            detok.add_token(token_id)
        assert detok.take_delta(is_finished=True) == expected


def test_no_tokens_after_a_stop() -> None:
    detok = IncrementalDetokenizer(TOKENIZER, stop=("a",))
    assert detok.add_token(TOKENIZER.encode("a")[0])
    with pytest.raises(RuntimeError, match="already ended at a stop string"):
        detok.add_token(5)


def test_multi_byte_characters_are_released_whole() -> None:
    tokenizer = load_default_tokenizer()
    text = "Café 🙂 naïve 日本語 ok"
    ids = tokenizer.encode(text)
    assert len(ids) > len(text.split())  # some characters span several tokens
    detok = IncrementalDetokenizer(tokenizer)
    deltas = []
    for token_id in ids:
        detok.add_token(token_id)
        deltas.append(detok.take_delta(is_finished=False))
    assert "".join(deltas) == text
    assert all("\ufffd" not in delta for delta in deltas)
