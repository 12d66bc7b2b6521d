"""A plain Llama forward pass to check the model against, written independently of it.

It follows Meta's original Llama code on llama.cpp's tensor layout: the raw GGUF tensors
(Q and K rows still permuted) and RoPE that rotates adjacent pairs (2i, 2i+1) as complex
numbers. The worker instead un-permutes Q and K and rotates half-heads the Hugging Face way, so
agreement checks the un-permutation and both RoPE conventions at once. No KV cache: every call
recomputes the whole sequence, one attention head at a time, in float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from backends.worker.config import ModelConfig


def to_float64(gguf_tensors: Mapping[str, np.ndarray]) -> dict[str, Tensor]:
    return {name: torch.from_numpy(array).double() for name, array in gguf_tensors.items()}


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def _rotate_pairs(x: Tensor, rotations: Tensor) -> Tensor:
    """x: [tokens, heads, head_dim]; rotations: complex [tokens, head_dim / 2]."""
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * rotations[:, None, :]).reshape(x.shape)


def reference_logits(t: Mapping[str, Tensor], config: ModelConfig, ids: Sequence[int],
                     *, last_only: bool = False) -> Tensor:
    """float64 logits [num_tokens, vocab] (or [1, vocab]) from raw GGUF tensors ``t``."""
    num_tokens, head_dim = len(ids), config.head_dim
    group = config.num_heads // config.num_kv_heads
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    angles = torch.outer(torch.arange(num_tokens, dtype=torch.float64),
                         config.rope_theta ** -exponents)
    rotations = torch.polar(torch.ones_like(angles), angles)
    future = torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool), diagonal=1)

    x = t["token_embd.weight"][list(ids)]
    for layer in range(config.num_layers):
        w = {name.split(".")[2]: tensor for name, tensor in t.items()
             if name.startswith(f"blk.{layer}.")}
        h = _rms_norm(x, w["attn_norm"], config.rms_norm_eps)
        q = _rotate_pairs((h @ w["attn_q"].T).reshape(num_tokens, -1, head_dim), rotations)
        k = _rotate_pairs((h @ w["attn_k"].T).reshape(num_tokens, -1, head_dim), rotations)
        v = (h @ w["attn_v"].T).reshape(num_tokens, -1, head_dim)
        heads = []
        for head in range(config.num_heads):
            kv_head = head // group
            scores = q[:, head] @ k[:, kv_head].T / math.sqrt(head_dim)
            scores = scores.masked_fill(future, -math.inf)
            heads.append(torch.softmax(scores, dim=-1) @ v[:, kv_head])
        x = x + torch.cat(heads, dim=-1) @ w["attn_output"].T
        h = _rms_norm(x, w["ffn_norm"], config.rms_norm_eps)
        gate, up = h @ w["ffn_gate"].T, h @ w["ffn_up"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ w["ffn_down"].T
    x = _rms_norm(x[-1:] if last_only else x, t["output_norm.weight"], config.rms_norm_eps)
    return x @ t.get("output.weight", t["token_embd.weight"]).T


def reference_greedy(t: Mapping[str, Tensor], config: ModelConfig, prompt_ids: Sequence[int],
                     num_tokens: int) -> list[int]:
    ids = list(prompt_ids)
    for _ in range(num_tokens):
        ids.append(int(reference_logits(t, config, ids, last_only=True).argmax()))
    return ids[len(prompt_ids):]
