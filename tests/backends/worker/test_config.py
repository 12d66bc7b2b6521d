from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from backends.tokenizer import default_model_path
from backends.worker.config import ModelConfig
from backends.worker.errors import ModelFormatError

SMOLLM2 = ModelConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
    max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,),
)
GGUF_METADATA: dict[str, Any] = {
    "general.architecture": "llama",
    "llama.block_count": 30, "llama.context_length": 8192, "llama.embedding_length": 576,
    "llama.feed_forward_length": 1536, "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3, "llama.rope.freq_base": 100000.0,
    "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": 49152,
    "llama.rope.dimension_count": 64,
    "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
}
HF_CONFIG: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
}


def test_reads_the_smollm2_gguf_header() -> None:
    config = ModelConfig.from_gguf(default_model_path(), tie_word_embeddings=True)
    assert config.rms_norm_eps == pytest.approx(1e-5)  # stored as float32 in the file
    assert dataclasses.replace(config, rms_norm_eps=1e-5) == SMOLLM2
    assert config.num_queries_per_kv == 3
    assert config.kv_bytes_per_token(dtype_bytes=2) == 2 * 30 * 3 * 64 * 2


@pytest.mark.parametrize(("changes", "expected"), [
    pytest.param({}, {}, id="smollm2"),
    pytest.param({"llama.attention.head_count_kv": None}, {"num_kv_heads": 9}, id="mha-default"),
    pytest.param({"llama.attention.key_length": 128, "llama.rope.dimension_count": 128},
                 {"head_dim": 128}, id="explicit-head-dim"),
    pytest.param({"llama.vocab_size": None, "tokenizer.ggml.tokens": ["a"] * 7},
                 {"vocab_size": 7}, id="vocab-from-token-list"),
    pytest.param({"llama.rope.freq_base": None}, {"rope_theta": 10000.0}, id="default-theta"),
    pytest.param({"tokenizer.ggml.eos_token_id": None}, {"eos_token_ids": ()}, id="no-eos"),
])
def test_from_gguf_metadata(changes: dict[str, Any], expected: dict[str, Any]) -> None:
    metadata = {k: v for k, v in (GGUF_METADATA | changes).items() if v is not None}
    config = ModelConfig.from_gguf_metadata(metadata, tie_word_embeddings=True)
    assert config == dataclasses.replace(SMOLLM2, **expected)


@pytest.mark.parametrize(("changes", "message"), [
    pytest.param({"general.architecture": "gpt2"}, "architecture 'gpt2'", id="architecture"),
    pytest.param({"llama.block_count": None}, "llama.block_count", id="missing-key"),
    pytest.param({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0},
                 "RoPE scaling", id="rope-scaling"),
    pytest.param({"llama.rope.dimension_count": 32}, "partial rotary", id="partial-rotary"),
    pytest.param({"llama.attention.head_count_kv": 4}, "multiple of num_kv_heads", id="gqa"),
])
def test_from_gguf_metadata_rejects(changes: dict[str, Any], message: str) -> None:
    metadata = {k: v for k, v in (GGUF_METADATA | changes).items() if v is not None}
    with pytest.raises(ModelFormatError, match=message):
        ModelConfig.from_gguf_metadata(metadata, tie_word_embeddings=True)


@pytest.mark.parametrize(("changes", "expected"), [
    pytest.param({}, {}, id="smollm2"),
    pytest.param({"num_key_value_heads": None}, {"num_kv_heads": 9}, id="mha-default"),
    pytest.param({"eos_token_id": [2, 7]}, {"eos_token_ids": (2, 7)}, id="eos-list"),
    pytest.param({"head_dim": 32}, {"head_dim": 32}, id="explicit-head-dim"),
    pytest.param({"tie_word_embeddings": None}, {"tie_word_embeddings": False}, id="untied"),
])
def test_from_hf_config(changes: dict[str, Any], expected: dict[str, Any]) -> None:
    config = {k: v for k, v in (HF_CONFIG | changes).items() if v is not None}
    assert ModelConfig.from_hf_config(config) == dataclasses.replace(SMOLLM2, **expected)


@pytest.mark.parametrize(("changes", "message"), [
    pytest.param({"model_type": "qwen2"}, "model_type 'qwen2'", id="model-type"),
    pytest.param({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling",
                 id="rope-scaling"),
    pytest.param({"attention_bias": True}, "biases", id="attention-bias"),
    pytest.param({"hidden_act": "gelu"}, "hidden_act", id="activation"),
    pytest.param({"num_hidden_layers": None}, "lacks 'num_hidden_layers'", id="missing-key"),
])
def test_from_hf_config_rejects(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelFormatError, match=message):
        ModelConfig.from_hf_config({k: v for k, v in (HF_CONFIG | changes).items()
                                    if v is not None})


def test_from_hf_dir(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match=r"config\.json"):
        ModelConfig.from_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG))
    assert ModelConfig.from_hf_dir(tmp_path) == SMOLLM2
