"""A Llama-family decoder in plain PyTorch: RMSNorm, RoPE, SwiGLU and grouped-query attention.

Parameter names follow Hugging Face's ``LlamaForCausalLM`` without the ``model.`` prefix
(``layers.0.self_attn.q_proj.weight``), so both loaders hand it a flat ``name -> tensor`` map.
Q and K use Hugging Face's RoPE layout (the two halves of a head rotate together); the GGUF
loader undoes llama.cpp's row permutation to get there.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from backends.worker.attention import KVCacheView, attention
from backends.worker.config import ModelConfig
from backends.worker.errors import ModelFormatError


def default_dtype(device: torch.device | str) -> torch.dtype:
    """The compute dtype: float32 on CPU (fast and exact there), bfloat16 on CUDA."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos and sin tables for the given positions, in float32 whatever the compute dtype."""

    inv_freq: Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.theta = config.rope_theta
        self.register_buffer("inv_freq", torch.empty(config.head_dim // 2), persistent=False)

    def reset_inv_freq(self) -> None:
        exponents = torch.arange(0, self.head_dim, 2, device=self.inv_freq.device) / self.head_dim
        self.inv_freq.copy_(1.0 / self.theta ** exponents.float())

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin of shape [batch, 1, num_tokens, head_dim] for positions [batch, num_tokens]."""
        angles = positions[..., None].float() * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)[:, None]
        return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x32 = x.float()
    first, second = x32.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_size, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=False, dtype=dtype)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv_view: KVCacheView | None) -> Tensor:
        batch_size, num_tokens, _ = x.shape
        q = self.q_proj(x).view(batch_size, num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(batch_size, num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch_size, num_tokens, self.num_kv_heads, self.head_dim)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        out = attention(q, k, v.transpose(1, 2), self.layer_index, kv_view)
        projected: Tensor = self.o_proj(out.transpose(1, 2).reshape(batch_size, num_tokens, -1))
        return projected


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        down: Tensor = self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        return down


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = Attention(config, layer_index, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv_view: KVCacheView | None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_view)
        out: Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class LlamaModel(nn.Module):
    """The decoder: token ids and positions in, hidden states out; `compute_logits` after.

    Example::

        model = LlamaModel.from_weights(config, weights, device="cpu")
        positions = torch.arange(len(ids))[None]
        hidden = model(torch.tensor([ids]), positions)            # no cache: whole sequences
        next_id = model.compute_logits(hidden[:, -1]).argmax(-1)
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        # A given _weight skips the random init (normal_ on meta costs ~2 s the first time).
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size, dtype=dtype))
        self.rotary = RotaryEmbedding(config)
        self.layers = nn.ModuleList(DecoderLayer(config, i, dtype)
                                    for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype)

    @classmethod
    def from_weights(cls, config: ModelConfig, weights: Mapping[str, Tensor], *,
                     device: torch.device | str = "cpu",
                     dtype: torch.dtype | None = None) -> LlamaModel:
        """Build on ``device`` in ``dtype`` (default: `default_dtype`) from Hugging Face-named
        weights (no ``model.`` prefix); ``lm_head.weight`` may be absent when embeddings are
        tied. Raises `ModelFormatError` on a missing, unexpected or misshapen tensor."""
        dtype = dtype or default_dtype(device)
        with torch.device("meta"):
            model = cls(config, dtype)
        model.rotary.inv_freq = torch.empty(config.head_dim // 2, device=device)
        model.rotary.reset_inv_freq()
        if config.tie_word_embeddings:
            weights = {name: w for name, w in weights.items() if name != "lm_head.weight"}
        expected = dict(model.named_parameters())
        if config.tie_word_embeddings:
            del expected["lm_head.weight"]
        if missing := sorted(set(expected) - set(weights)):
            raise ModelFormatError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
        if unexpected := sorted(set(weights) - set(expected)):
            raise ModelFormatError(f"checkpoint has unknown tensors, e.g. {unexpected[:3]}")
        for name, placeholder in expected.items():
            if weights[name].shape != placeholder.shape:
                raise ModelFormatError(f"{name}: shape {tuple(weights[name].shape)} in the "
                                       f"checkpoint, {tuple(placeholder.shape)} in the model")
            # Adopt the loaded tensor (no copy when device and dtype already match).
            module_name, _, leaf = name.rpartition(".")
            value = weights[name].to(device=device, dtype=dtype)
            setattr(model.get_submodule(module_name), leaf, nn.Parameter(value, False))
        if config.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        return model.requires_grad_(False).eval()

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: Tensor, positions: Tensor,
                kv_view: KVCacheView | None = None) -> Tensor:
        """Hidden states [batch, num_tokens, hidden_size] for ids and positions
        [batch, num_tokens]. Without ``kv_view`` each row is a whole sequence from position 0."""
        cos, sin = self.rotary(positions)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, kv_view)
        normed: Tensor = self.norm(x)
        return normed

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """float32 logits over the vocabulary for hidden states from `forward`."""
        logits: Tensor = self.lm_head(hidden)
        return logits.float()
