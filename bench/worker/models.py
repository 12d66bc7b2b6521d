"""The benchmark's model: the bundled SmolLM2 (or a GGUF / Hugging Face path), or, for the
``--quick`` smoke run, a tiny random Llama with SmolLM2's tokenizer and vocabulary.

Example::

    model, tokenizer = load_bench_model(None, device="cpu", tiny=False)   # real SmolLM2
    model, tokenizer = load_bench_model(None, device="cpu", tiny=True)    # ~3.5M params
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from backends.tokenizer import (
    ModelTokenizer,
    default_model_path,
    load_default_tokenizer,
    load_tokenizer_from_gguf,
)
from backends.worker.config import ModelConfig
from backends.worker.loading import load_model_and_tokenizer
from backends.worker.model import LlamaModel

# SmolLM2's vocabulary, so its tokenizer drives the tiny model; the rest is small.
TINY_CONFIG = ModelConfig(
    vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5,
    max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,),
)


def load_bench_model(path: Path | None, *, device: str, tiny: bool,
                     dtype: torch.dtype | None = None) -> tuple[LlamaModel, ModelTokenizer]:
    """The model on ``device`` and its tokenizer, offline."""
    if not tiny:
        return load_model_and_tokenizer(path, device=device, dtype=dtype)
    tokenizer = load_tokenizer_from_gguf(path) if path is not None and path.suffix == ".gguf" \
        else load_default_tokenizer()
    return tiny_random_model(device=device, dtype=dtype), tokenizer


def tiny_random_model(*, device: str, dtype: torch.dtype | None = None,
                      seed: int = 0) -> LlamaModel:
    """`TINY_CONFIG` with seeded random weights scaled so activations stay O(1)."""
    generator = torch.Generator().manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in _parameter_shapes(TINY_CONFIG).items():
        if name.endswith("norm.weight"):
            weights[name] = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        else:
            weights[name] = torch.randn(shape, generator=generator) / math.sqrt(shape[-1])
    return LlamaModel.from_weights(TINY_CONFIG, weights, device=device, dtype=dtype)


def _parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    hidden, inter = config.hidden_size, config.intermediate_size
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (config.vocab_size, hidden),
                                          "norm.weight": (hidden,)}
    for i in range(config.num_layers):
        shapes |= {
            f"layers.{i}.input_layernorm.weight": (hidden,),
            f"layers.{i}.self_attn.q_proj.weight": (q_size, hidden),
            f"layers.{i}.self_attn.k_proj.weight": (kv_size, hidden),
            f"layers.{i}.self_attn.v_proj.weight": (kv_size, hidden),
            f"layers.{i}.self_attn.o_proj.weight": (hidden, q_size),
            f"layers.{i}.post_attention_layernorm.weight": (hidden,),
            f"layers.{i}.mlp.gate_proj.weight": (inter, hidden),
            f"layers.{i}.mlp.up_proj.weight": (inter, hidden),
            f"layers.{i}.mlp.down_proj.weight": (hidden, inter),
        }
    return shapes


def model_label(path: Path | None, *, tiny: bool) -> str:
    if tiny:
        return "tiny-random (SmolLM2 vocabulary)"
    return (path or default_model_path()).name
