"""Load a llama.cpp GGUF checkpoint into `LlamaModel`.

Every tensor is dequantized (Q4_1, Q8_0, F16, ... → float32 with `gguf_file`) and renamed to
Hugging Face's names. llama.cpp's converter (``convert_hf_to_gguf.py``) permutes the rows of Q
and K so that each head's RoPE pairs are adjacent (GPT-J style, rows 2i and 2i+1), where Hugging
Face rotates the two halves of the head (rows i and i + head_dim/2); `unpermute_qk` undoes it.
A file without ``output.weight`` has tied embeddings.

Example::

    model = load_gguf(default_model_path(), device="cpu")
"""

from __future__ import annotations

import os
import re

import numpy as np
import torch

from backends.tokenizer.gguf_metadata import read_gguf_metadata
from backends.worker.config import ModelConfig
from backends.worker.errors import ModelFormatError
from backends.worker.gguf_file import read_dequantized
from backends.worker.model import LlamaModel

_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute(w, n_head)``: for each head, rows (2i, 2i+1) go back to
    (i, i + head_dim/2). ``num_heads`` is the number of KV heads for K."""
    rows = weight.shape[0]
    per_head = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weight.shape)


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` → ``layers.3.self_attn.q_proj.weight``."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise ModelFormatError(f"GGUF tensor {gguf_name!r} has no place in a Llama model")
    return f"layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.weight"


def load_gguf(path: str | os.PathLike[str], *, device: torch.device | str = "cpu",
              dtype: torch.dtype | None = None) -> LlamaModel:
    """A `LlamaModel` on ``device`` from a GGUF file (``dtype`` defaults to `default_dtype`)."""
    tensors = dict(read_dequantized(path))
    if "rope_freqs.weight" in tensors:
        raise ModelFormatError(f"{path}: per-frequency RoPE factors (Llama 3.1 style) are not "
                               "supported yet")
    config = ModelConfig.from_gguf_metadata(
        read_gguf_metadata(path), tie_word_embeddings="output.weight" not in tensors)
    weights = {}
    for name, array in tensors.items():
        if name.endswith("attn_q.weight"):
            array = unpermute_qk(array, config.num_heads)
        elif name.endswith("attn_k.weight"):
            array = unpermute_qk(array, config.num_kv_heads)
        weights[hf_name(name)] = torch.from_numpy(array)
    return LlamaModel.from_weights(config, weights, device=device, dtype=dtype)
