"""Tiny random Llama checkpoints written the way the real tools write them.

`write_gguf` follows llama.cpp's ``convert_hf_to_gguf.py``: Hugging Face names become GGUF names
and the Q and K rows are permuted with the converter's own ``permute`` (copied verbatim below),
so the loader's un-permutation is checked against the real thing, not against itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.numpy import save_file

from backends.worker.config import ModelConfig
from backends.worker.model import LlamaModel

TINY_CONFIG = ModelConfig(
    vocab_size=96, hidden_size=64, intermediate_size=80, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=2.0**-17,  # exact in float32
    max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=1, eos_token_ids=(2,),
)

_GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def converter_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """``LlamaModel.permute`` from llama.cpp's convert_hf_to_gguf.py, unchanged."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def random_hf_weights(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Hugging Face-named float32 weights (with the ``model.`` prefix), scaled like a trained
    model's so activations stay O(1)."""
    rng = np.random.default_rng(seed)
    hidden, inter = config.hidden_size, config.intermediate_size
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)

    weights = {"model.embed_tokens.weight": matrix(config.vocab_size, hidden),
               "model.norm.weight": norm()}
    if not config.tie_word_embeddings:
        weights["lm_head.weight"] = matrix(config.vocab_size, hidden)
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}."
        weights |= {
            prefix + "input_layernorm.weight": norm(),
            prefix + "self_attn.q_proj.weight": matrix(q_size, hidden),
            prefix + "self_attn.k_proj.weight": matrix(kv_size, hidden),
            prefix + "self_attn.v_proj.weight": matrix(kv_size, hidden),
            prefix + "self_attn.o_proj.weight": matrix(hidden, q_size),
            prefix + "post_attention_layernorm.weight": norm(),
            prefix + "mlp.gate_proj.weight": matrix(inter, hidden),
            prefix + "mlp.up_proj.weight": matrix(inter, hidden),
            prefix + "mlp.down_proj.weight": matrix(hidden, inter),
        }
    return weights


def hf_config_json(config: ModelConfig) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads, "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings, "hidden_act": "silu",
        "bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_ids[0],
        "torch_dtype": "float32",
    }


def write_hf_dir(path: Path, config: ModelConfig, weights: Mapping[str, np.ndarray],
                 *, num_shards: int = 2) -> Path:
    """config.json plus the weights split over ``num_shards`` safetensors files."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config_json(config)))
    names = sorted(weights)
    for shard in range(num_shards):
        part = {name: weights[name] for name in names[shard::num_shards]}
        save_file(part, str(path / f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"))
    return path


def gguf_name(hf_name: str) -> str:
    name = hf_name.removeprefix("model.")
    fixed = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if name in fixed:
        return fixed[name]
    _, index, rest = name.split(".", 2)
    return f"blk.{index}.{_GGUF_LAYER_NAMES[rest.removesuffix('.weight')]}.weight"


def write_gguf(path: Path, config: ModelConfig, weights: Mapping[str, np.ndarray],
               qtypes: Mapping[str, gguf.GGMLQuantizationType] | None = None) -> Path:
    """A llama GGUF as convert_hf_to_gguf.py writes it; ``qtypes`` quantizes named tensors."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_bos_token_id(config.bos_token_id or 0)
    writer.add_eos_token_id(config.eos_token_ids[0])
    for hf_name, array in weights.items():
        if hf_name.endswith("q_proj.weight"):
            array = converter_permute(array, config.num_heads, config.num_heads)
        elif hf_name.endswith("k_proj.weight"):
            array = converter_permute(array, config.num_heads, config.num_kv_heads)
        name = gguf_name(hf_name)
        qtype = (qtypes or {}).get(name, gguf.GGMLQuantizationType.F32)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def as_torch(weights: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Hugging Face-named weights as the model names its parameters."""
    return {name.removeprefix("model."): torch.from_numpy(array.copy())
            for name, array in weights.items()}


def tiny_model(config: ModelConfig = TINY_CONFIG, seed: int = 0) -> LlamaModel:
    """A random float32 `LlamaModel` on CPU, built straight from Hugging Face-named weights."""
    return LlamaModel.from_weights(config, as_torch(random_hf_weights(config, seed)))
