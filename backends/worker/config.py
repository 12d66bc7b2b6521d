"""`ModelConfig`: the shape of a Llama-family decoder, read from GGUF metadata or a config.json.

Pure Python (no torch), so the engine's scheduler, the heartbeat and the KV-capacity maths can
use it without loading a model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.tokenizer.gguf_metadata import read_gguf_metadata
from backends.worker.errors import ModelFormatError

SUPPORTED_GGUF_ARCHITECTURES = ("llama",)
SUPPORTED_HF_MODEL_TYPES = ("llama",)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The hyper-parameters a Llama-family decoder is built from.

    Example::

        config = ModelConfig.from_gguf(default_model_path())
        config.num_heads, config.num_kv_heads, config.head_dim    # (9, 3, 64) for SmolLM2-135M
        config.kv_bytes_per_token(dtype_bytes=2)                  # 2 * 30 * 3 * 64 * 2 = 23040
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelFormatError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ModelFormatError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V one token occupies across all layers; GQA stores only KV heads."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str], *, tie_word_embeddings: bool) -> ModelConfig:
        """Read the header of a GGUF file. Whether ``output.weight`` exists (untied) is not in
        the header, so the loader, which lists the tensors, says."""
        return cls.from_gguf_metadata(read_gguf_metadata(path),
                                      tie_word_embeddings=tie_word_embeddings)

    @classmethod
    def from_gguf_metadata(
        cls, metadata: Mapping[str, Any], *, tie_word_embeddings: bool
    ) -> ModelConfig:
        arch = metadata.get("general.architecture")
        if arch not in SUPPORTED_GGUF_ARCHITECTURES:
            raise ModelFormatError(
                f"GGUF architecture {arch!r} is not supported; the worker runs "
                f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)} models"
            )

        def key(name: str, default: Any = None) -> Any:
            value = metadata.get(f"{arch}.{name}", default)
            if value is None:
                raise ModelFormatError(f"GGUF metadata lacks '{arch}.{name}'")
            return value

        rope_scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
        if rope_scaling != "none" and metadata.get(f"{arch}.rope.scaling.factor") != 1.0:
            raise ModelFormatError("GGUF models with RoPE scaling are not supported yet")
        hidden_size = int(key("embedding_length"))
        num_heads = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", hidden_size // num_heads))
        if int(key("rope.dimension_count", head_dim)) != head_dim:
            raise ModelFormatError("partial rotary embeddings (rope.dimension_count < head_dim) "
                                   "are not supported")
        tokens = metadata.get("tokenizer.ggml.tokens")
        vocab_size = metadata.get(f"{arch}.vocab_size", len(tokens) if tokens else None)
        if vocab_size is None:
            raise ModelFormatError(f"GGUF metadata lacks '{arch}.vocab_size' and a token list")
        eos = metadata.get("tokenizer.ggml.eos_token_id")
        return cls(
            vocab_size=int(vocab_size),
            hidden_size=hidden_size,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=num_heads,
            num_kv_heads=int(key("attention.head_count_kv", num_heads)),
            head_dim=head_dim,
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=int(key("context_length")),
            tie_word_embeddings=tie_word_embeddings,
            bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (int(eos),),
        )

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike[str]) -> ModelConfig:
        config_path = Path(path) / "config.json"
        try:
            return cls.from_hf_config(json.loads(config_path.read_text()))
        except FileNotFoundError:
            raise ModelFormatError(f"{config_path} not found: a Hugging Face model directory "
                                   "needs config.json beside its *.safetensors") from None

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelConfig:
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_HF_MODEL_TYPES:
            raise ModelFormatError(
                f"model_type {model_type!r} is not supported; the worker runs "
                f"{', '.join(SUPPORTED_HF_MODEL_TYPES)} models"
            )
        if config.get("rope_scaling"):
            raise ModelFormatError("models with rope_scaling are not supported yet")
        if config.get("attention_bias") or config.get("mlp_bias"):
            raise ModelFormatError("models with attention or MLP biases are not supported")
        if config.get("hidden_act", "silu") != "silu":
            raise ModelFormatError(f"hidden_act {config['hidden_act']!r} is not supported")

        def required(name: str) -> int:
            if name not in config:
                raise ModelFormatError(f"config.json lacks '{name}'")
            return int(config[name])

        num_heads = required("num_attention_heads")
        hidden_size = required("hidden_size")
        eos = config.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        return cls(
            vocab_size=required("vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=required("intermediate_size"),
            num_layers=required("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(config.get("head_dim") or hidden_size // num_heads),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=tuple(int(i) for i in eos_ids),
        )
