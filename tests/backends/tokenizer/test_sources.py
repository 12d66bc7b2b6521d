"""Tokenizers from other sources: a tokenizer.json round trip, tiny GGUF files, and a GGUF
tokenizer model that is not supported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.tokenizer import (
    SMOLLM2_CHAT_TEMPLATE,
    ModelTokenizer,
    TokenizerError,
    UnsupportedTokenizerError,
    load_tokenizer_from_gguf,
    load_tokenizer_from_json,
)
from tests.backends.tokenizer.reference import REFERENCE_TEXTS, USER, bytes_to_unicode


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
