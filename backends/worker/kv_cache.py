"""The paged KV cache: fixed-size blocks of keys and values per layer, addressed by slot.

Layout: one keys and one values tensor ``[num_layers, num_blocks, block_size, num_kv_heads,
head_dim]``; slot ``s`` is token ``s % block_size`` of block ``s // block_size``. Only the KV
heads are stored, so grouped-query attention divides the cache by ``num_heads / num_kv_heads``.
The block manager (``backends.sim.block_manager``) decides which blocks a sequence owns; this
module only stores and reads them.

Storage dtypes: ``float32``, ``float16``, ``bfloat16``, or ``int8``. int8 is symmetric and
quantized per block and per KV head: each (layer, block, head) has one float32 scale for K and
one for V, ``scale = absmax / 127`` over the block's tokens and the head's channels, and stores
``round(x / scale)`` in [-127, 127]; reads return ``q * scale`` in the compute dtype. A block
fills over several steps, so when new tokens raise a block's absmax the block's earlier tokens
are requantized to the larger scale (one more rounding, at most half a step of the new scale);
a write at offset 0 starts a block afresh (new owner) and forgets its old scale.

Bytes per token are exact: ``2 * num_layers * num_kv_heads * head_dim * dtype_bytes`` plus, for
int8, the scales, ``2 * num_layers * num_kv_heads * 4 / block_size``.

Example::

    spec = KVCacheSpec.from_config(config, block_size=16, kv_dtype="int8")
    num_blocks = plan_num_blocks(spec, torch.device("cpu"), kv_cache_gib=0.5)
    cache = PagedKVCache(spec, num_blocks, device="cpu", compute_dtype=torch.float32)
    write = cache.prepare_write(slots)          # once per step
    cache.write(layer_index, write, k, v)       # k, v: [num_tokens, num_kv_heads, head_dim]
    keys, values = cache.gather(layer_index, block_ids)   # [..., block_size, heads, head_dim]
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from backends.worker.config import ModelConfig

KV_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8,
}
INT8_MAX = 127.0
SCALE_BYTES = 4  # float32 scales
DEFAULT_CUDA_MEMORY_FRACTION = 0.9  # of the free device memory once the model is loaded
DEFAULT_CPU_MEMORY_FRACTION = 0.1  # of the available RAM: the CPU is shared with the host


def kv_dtype_name(kv_dtype: str | torch.dtype) -> str:
    """The storage dtype's name; ValueError for one the cache does not store."""
    for name, dtype in KV_DTYPES.items():
        if kv_dtype in (name, dtype):
            return name
    raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """The shape and storage dtype of a paged KV cache, and its exact size.

    Example::

        spec = KVCacheSpec.from_config(smollm2_config, block_size=16, kv_dtype="float16")
        spec.bytes_per_token    # 2 * 30 layers * 3 KV heads * 64 * 2 bytes = 23040.0
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    kv_dtype: str

    def __post_init__(self) -> None:
        kv_dtype_name(self.kv_dtype)
        if min(self.num_layers, self.num_kv_heads, self.head_dim, self.block_size) < 1:
            raise ValueError("num_layers, num_kv_heads, head_dim and block_size must be >= 1")

    @classmethod
    def from_config(cls, config: ModelConfig, *, block_size: int,
                    kv_dtype: str | torch.dtype) -> KVCacheSpec:
        return cls(config.num_layers, config.num_kv_heads, config.head_dim, block_size,
                   kv_dtype_name(kv_dtype))

    @property
    def dtype(self) -> torch.dtype:
        return KV_DTYPES[self.kv_dtype]

    @property
    def is_quantized(self) -> bool:
        return self.kv_dtype == "int8"

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block in every layer, int8 scales included."""
        elements = 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim
        scales = 2 * self.num_layers * self.num_kv_heads if self.is_quantized else 0
        return elements * self.dtype.itemsize + scales * SCALE_BYTES

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_per_block / self.block_size

    def num_blocks_for_bytes(self, num_bytes: float) -> int:
        return int(num_bytes // self.bytes_per_block)


def available_memory_bytes(device: torch.device) -> int:
    """Free device memory on CUDA; the kernel's MemAvailable (all free RAM) on CPU."""
    if device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        return int(free_bytes)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_num_blocks(
    spec: KVCacheSpec,
    device: torch.device,
    *,
    num_blocks: int | None = None,
    kv_cache_gib: float | None = None,
    memory_fraction: float | None = None,
) -> int:
    """How many blocks to allocate: ``num_blocks`` if given, else what ``kv_cache_gib`` holds,
    else ``memory_fraction`` of the available memory (default 0.9 of free CUDA memory, 0.1 of
    available RAM). ValueError if that is not even one block."""
    if num_blocks is not None and kv_cache_gib is not None:
        raise ValueError("give the KV cache size as num_blocks or kv_cache_gib, not both")
    if num_blocks is not None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        return num_blocks
    if kv_cache_gib is not None:
        if kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {kv_cache_gib}")
        budget_bytes = kv_cache_gib * 2**30
        source = f"kv_cache_gib={kv_cache_gib}"
    else:
        default = (DEFAULT_CUDA_MEMORY_FRACTION if device.type == "cuda"
                   else DEFAULT_CPU_MEMORY_FRACTION)
        fraction = default if memory_fraction is None else memory_fraction
        if not 0 < fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {fraction}")
        available = available_memory_bytes(device)
        budget_bytes = fraction * available
        source = f"{fraction} of the {available / 2**30:.2f} GiB available on {device}"
    blocks = spec.num_blocks_for_bytes(budget_bytes)
    if blocks < 1:
        raise ValueError(f"{source} does not hold one KV block ({spec.bytes_per_block} bytes); "
                         "give a larger kv_cache_gib or num_blocks")
    return blocks


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Where one step's new tokens go, shared by every layer's write."""

    slots: Tensor  # [num_tokens] flat slot per new token
    blocks: Tensor  # [num_touched] the blocks written to (int8 only)
    block_of_token: Tensor  # [num_tokens] index into ``blocks`` (int8 only)
    is_fresh: Tensor  # [num_touched] written at offset 0: a new owner (int8 only)


class PagedKVCache:
    """The blocks themselves; see the module docstring for the layout and the int8 scheme.

    Example::

        cache = PagedKVCache(spec, num_blocks=256, device="cpu", compute_dtype=torch.float32)
        cache.num_bytes == 256 * spec.bytes_per_block
    """

    def __init__(self, spec: KVCacheSpec, num_blocks: int, *, device: torch.device | str,
                 compute_dtype: torch.dtype) -> None:
        self.spec = spec
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        self.compute_dtype = compute_dtype
        shape = (spec.num_layers, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        # Zeroed, never empty: padding reads stale blocks under a mask, and a NaN left there
        # would survive the mask (0 * NaN).
        self.keys = torch.zeros(shape, dtype=spec.dtype, device=self.device)
        self.values = torch.zeros(shape, dtype=spec.dtype, device=self.device)
        scale_shape = (spec.num_layers, num_blocks, spec.num_kv_heads) if spec.is_quantized \
            else (0,)
        self.key_scales = torch.zeros(scale_shape, dtype=torch.float32, device=self.device)
        self.value_scales = torch.zeros(scale_shape, dtype=torch.float32, device=self.device)

    @property
    def num_bytes(self) -> int:
        tensors = (self.keys, self.values, self.key_scales, self.value_scales)
        return sum(t.numel() * t.element_size() for t in tensors)

    def prepare_write(self, slots: Tensor) -> WritePlan:
        """Index the step's slots once; every layer's `write` reuses it."""
        if not self.spec.is_quantized:
            return WritePlan(slots, slots[:0], slots[:0], slots[:0].bool())
        block_ids = slots // self.spec.block_size
        blocks, block_of_token = torch.unique(block_ids, return_inverse=True)
        is_fresh = torch.zeros(blocks.shape, dtype=torch.bool, device=slots.device)
        is_fresh.index_fill_(0, block_of_token[slots % self.spec.block_size == 0], True)
        return WritePlan(slots, blocks, block_of_token, is_fresh)

    def write(self, layer_index: int, plan: WritePlan, k: Tensor, v: Tensor) -> None:
        """Store the step's new keys and values ([num_tokens, num_kv_heads, head_dim])."""
        if self.spec.is_quantized:
            self._write_int8(self.keys[layer_index], self.key_scales[layer_index], plan, k)
            self._write_int8(self.values[layer_index], self.value_scales[layer_index], plan, v)
            return
        heads, dim, dtype = self.spec.num_kv_heads, self.spec.head_dim, self.spec.dtype
        self.keys[layer_index].view(-1, heads, dim).index_copy_(0, plan.slots, k.to(dtype))
        self.values[layer_index].view(-1, heads, dim).index_copy_(0, plan.slots, v.to(dtype))

    def gather(self, layer_index: int, block_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``block_ids`` (any shape ``S``) as ``[*S, block_size,
        num_kv_heads, head_dim]`` in the compute dtype."""
        keys = self.keys[layer_index][block_ids]
        values = self.values[layer_index][block_ids]
        if not self.spec.is_quantized:
            return keys.to(self.compute_dtype), values.to(self.compute_dtype)
        key_scales = self.key_scales[layer_index][block_ids][..., None, :, None]
        value_scales = self.value_scales[layer_index][block_ids][..., None, :, None]
        return ((keys.float() * key_scales).to(self.compute_dtype),
                (values.float() * value_scales).to(self.compute_dtype))

    def _write_int8(self, data: Tensor, scales: Tensor, plan: WritePlan, x: Tensor) -> None:
        x = x.float()
        token_absmax = x.abs().amax(dim=-1)  # [num_tokens, heads]
        block_absmax = torch.zeros((len(plan.blocks), x.shape[1]), device=x.device)
        block_absmax.scatter_reduce_(
            0, plan.block_of_token[:, None].expand_as(token_absmax), token_absmax, "amax")
        old_scales = scales[plan.blocks].masked_fill(plan.is_fresh[:, None], 0.0)
        new_scales = torch.maximum(old_scales, block_absmax / INT8_MAX).clamp_min(1e-12)
        # Earlier tokens of a growing block move to the larger scale.
        ratio = (old_scales / new_scales)[:, None, :, None]
        data[plan.blocks] = torch.round(data[plan.blocks].float() * ratio).to(torch.int8)
        scales[plan.blocks] = new_scales
        token_scales = new_scales[plan.block_of_token][:, :, None]
        quantized = torch.round(x / token_scales).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        data.view(-1, *data.shape[2:]).index_copy_(0, plan.slots, quantized)
