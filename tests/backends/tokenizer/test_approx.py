"""ApproxTokenizer: its counts near the real tokenizer's, the same ids in every process, its
specials; and get_tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from backends.tokenizer import ApproxTokenizer, ModelTokenizer, Tokenizer, get_tokenizer
from tests.backends.tokenizer.reference import ROOT, USER

PROSE = (
    "The history of the printing press is a story about more than machines. When Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden screw press around 1450, "
    "he made it possible to produce books far faster and more cheaply than scribes could copy "
    "them by hand. Within fifty years, presses were operating in more than two hundred cities "
    "across Europe, and millions of volumes had been printed. Scholars argue about how quickly "
    "ideas spread as a result, but few doubt that the change was profound."
)
CHAT = (
    "Hi! Could you help me write a short email to my landlord? The heating in my apartment has "
    "not been working since Tuesday, and it's getting really cold at night. I'd like to ask "
    "politely when someone can come to fix it, and mention that I'm home most afternoons."
)


def _code() -> str:
    return (ROOT / "backends" / "tokenizer" / "approx.py").read_text()


# approx/real token-count ratio bounds, as stated in ApproxTokenizer's docstring.
APPROX_RATIOS = [
    pytest.param(lambda: PROSE, 0.9, 1.1, id="english-prose"),
    pytest.param(lambda: CHAT, 0.9, 1.1, id="english-chat"),
    pytest.param(_code, 0.85, 1.15, id="python-code"),
    pytest.param(lambda: "Order 12345 shipped 2024-03-17, total $1,299.99 (SKU 88812)",
                 0.7, 1.3, id="numbers"),
    pytest.param(lambda: "東京は日本の首都です。人口は約千四百万人で、世界最大級の都市です。",
                 0.7, 1.3, id="japanese"),
    pytest.param(lambda: "Die Geschwindigkeitsbegrenzung wird seit Jahrzehnten diskutiert.",
                 0.3, 0.8, id="german-undercounts"),
]


@pytest.mark.parametrize(("text", "low", "high"), APPROX_RATIOS)
def test_approx_count_is_near_real(real: ModelTokenizer, text: Callable[[], str],
                                   low: float, high: float) -> None:
    ratio = len(ApproxTokenizer().encode(text())) / len(real.encode(text()))
    assert low <= ratio <= high, ratio


def test_approx_is_the_same_in_every_process() -> None:
    code = ("import json; from backends.tokenizer import ApproxTokenizer; "
            f"print(json.dumps(ApproxTokenizer().encode({PROSE + ' 東京 😀'!r})))")
    outputs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2")
    ]
    assert json.loads(outputs[0]) == json.loads(outputs[1]) == ApproxTokenizer().encode(
        PROSE + " 東京 😀")


def test_approx_ids_decode_and_specials() -> None:
    tokenizer = ApproxTokenizer()
    ids = tokenizer.encode(PROSE)
    assert all(17 <= token_id < tokenizer.vocab_size for token_id in ids)
    assert len(tokenizer.encode(tokenizer.decode(ids))) == len(ids)
    chat_ids = tokenizer.encode_chat([USER])
    assert chat_ids[0] == tokenizer.bos_token_id == 1
    assert chat_ids.count(tokenizer.eos_token_id) == 2
    assert tokenizer.decode([1, 2], skip_special_tokens=False) == "<|im_start|><|im_end|>"
    assert tokenizer.decode([1, 2], skip_special_tokens=True) == ""
    assert tokenizer.encode_batch(["a b", ""]) == [tokenizer.encode("a b"), []]


def test_get_tokenizer(real: ModelTokenizer) -> None:
    approx: Tokenizer = get_tokenizer("approx")
    assert isinstance(approx, ApproxTokenizer)
    assert approx.vocab_size == real.vocab_size and approx.eos_token_id == real.eos_token_id
    with pytest.raises(ValueError, match="'real' or 'approx'"):
        get_tokenizer("exact")  # type: ignore[arg-type]
