"""The attention seam: where a forward step's keys and values are stored and read back.

The model calls `attention(q, k, v, layer_index, kv_view)` in every layer. With no view it runs
causal attention over the step's own tokens (a whole sequence, no cache). With a view, the view
stores the new keys and values and attends over everything cached for each sequence: the simple
`ContiguousKVCache` below now, a paged cache with block tables later, behind the same protocol.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from backends.worker.config import ModelConfig


class KVCacheView(Protocol):
    """One forward step's window onto a KV cache (it knows the step's token positions)."""

    def attend(self, layer_index: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store ``k``, ``v`` ([batch, num_kv_heads, num_tokens, head_dim]) and return the
        attention output for ``q`` ([batch, num_heads, num_tokens, head_dim])."""
        ...


def attention(q: Tensor, k: Tensor, v: Tensor, layer_index: int,
              kv_view: KVCacheView | None) -> Tensor:
    """Grouped-query attention: ``q`` has num_heads heads, ``k`` and ``v`` num_kv_heads."""
    if kv_view is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return kv_view.attend(layer_index, q, k, v)


class ContiguousKVCache:
    """One [batch, num_kv_heads, max_tokens, head_dim] K and V buffer per layer.

    Token ``i`` of batch row ``b`` lives at slot ``positions[b, i]``; a query attends to the
    slots at or before its own position, so rows of different lengths can share a step.

    Example::

        cache = ContiguousKVCache(config, batch_size=1, max_tokens=64, device=device,
                                  dtype=torch.float32)
        positions = torch.arange(len(prompt_ids))[None]
        hidden = model(torch.tensor([prompt_ids]), positions, cache.view(positions))
    """

    def __init__(self, config: ModelConfig, *, batch_size: int, max_tokens: int,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        shape = (config.num_layers, batch_size, config.num_kv_heads, max_tokens, config.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def max_tokens(self) -> int:
        return self.keys.shape[3]

    def view(self, positions: Tensor) -> ContiguousKVView:
        """The view for one step over tokens at ``positions`` ([batch, num_tokens])."""
        return ContiguousKVView(self, positions)


class ContiguousKVView:
    """`KVCacheView` of a `ContiguousKVCache` for one step; see `ContiguousKVCache.view`."""

    def __init__(self, cache: ContiguousKVCache, positions: Tensor) -> None:
        batch_size, num_tokens = positions.shape
        num_keys = int(positions.max()) + 1
        if num_keys > cache.max_tokens or int(positions.min()) < 0:
            raise ValueError(f"positions must lie in [0, {cache.max_tokens}); "
                             f"got up to {num_keys - 1}")
        if batch_size != cache.keys.shape[1]:
            raise ValueError(f"the cache holds {cache.keys.shape[1]} rows, the step has "
                             f"{batch_size}")
        self._cache = cache
        self._num_keys = num_keys
        self._slots = positions[:, None, :, None].expand(
            batch_size, cache.keys.shape[2], num_tokens, cache.keys.shape[4])
        key_positions = torch.arange(num_keys, device=positions.device)
        self._mask = key_positions[None, None, None, :] <= positions[:, None, :, None]

    def attend(self, layer_index: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        keys = self._cache.keys[layer_index]
        values = self._cache.values[layer_index]
        keys.scatter_(2, self._slots, k.to(keys.dtype))
        values.scatter_(2, self._slots, v.to(values.dtype))
        return F.scaled_dot_product_attention(
            q, keys[:, :, : self._num_keys], values[:, :, : self._num_keys],
            attn_mask=self._mask, enable_gqa=True,
        )
